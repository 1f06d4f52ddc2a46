"""The process-wide runtime: engines loaded once and shared, the executor, the stage limits.

Everything a transport needs to serve a session hangs off one `Runtime`; tests build one
with fake engines (`Runtime.from_engines`) to exercise the pipeline alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from voxserve.config import EngineSpec, Settings
from voxserve.engines.base import AsrEngine, Responder, TtsEngine, VadEngine, close_engine
from voxserve.engines.registry import engine_class
from voxserve.errors import ErrorCode, VoxError
from voxserve.observe.metrics import Metrics
from voxserve.pipeline.executor import AdaptiveExecutor
from voxserve.pipeline.stage import EngineStage
from voxserve.types import Voice

log = logging.getLogger(__name__)

# OpenAI's model names map to the default engines so the official SDK works unchanged.
OPENAI_TTS_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
OPENAI_ASR_MODELS = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")


@dataclass
class Engines:
    vad: VadEngine
    asr: AsrEngine
    tts: list[TtsEngine]
    responder: Responder
    default_voice: str
    load_seconds: dict[str, float] = field(default_factory=dict)
    _voices: dict[str, tuple[Voice, TtsEngine]] = field(default_factory=dict)
    _aliases: dict[str, tuple[Voice, TtsEngine]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for engine in self.tts:
            for voice in engine.voices():
                self._voices.setdefault(voice.id, (voice, engine))
        for voice, engine in list(self._voices.values()):
            for alias in voice.aliases:
                self._aliases.setdefault(alias, (voice, engine))
        if self.default_voice not in self._voices and self._voices:
            self.default_voice = next(iter(self._voices))

    def voices(self) -> list[Voice]:
        return [voice for voice, _ in self._voices.values()]

    def voice(self, voice_id: str | None) -> tuple[Voice, TtsEngine]:
        """Resolve a voice id (None = default) or raise UNKNOWN_VOICE listing the valid ids."""
        key = voice_id or self.default_voice
        found = self._voices.get(key) or self._aliases.get(key)
        if found is None:
            valid = ", ".join(sorted(self._voices))
            raise VoxError(ErrorCode.UNKNOWN_VOICE, f"unknown voice {key!r}; valid voices: {valid}")
        return found

    def check_language(self, language: str | None) -> str | None:
        if language is None or language in self.asr.languages:
            return language
        valid = ", ".join(self.asr.languages)
        raise VoxError(
            ErrorCode.UNKNOWN_LANGUAGE, f"language {language!r} is not served; valid: {valid}"
        )

    def close(self) -> None:
        for engine in (self.vad, self.asr, *self.tts, self.responder):
            close_engine(engine)


def _build(kind: str, spec: EngineSpec, default_threads: int) -> tuple[Any, float]:
    cls = engine_class(kind, spec.name)
    options = dict(spec.options)
    started = time.perf_counter()
    if kind != "responder" and "threads" not in options:
        options["threads"] = default_threads
    engine = cls(**options)
    return engine, time.perf_counter() - started


def load_engines(settings: Settings) -> Engines:
    """Construct every configured engine once (blocking; seconds)."""
    cfg = settings.engines
    seconds: dict[str, float] = {}
    vad, seconds["vad"] = _build("vad", cfg.vad, cfg.default_threads)
    asr, seconds["asr"] = _build("asr", cfg.asr, cfg.default_threads)
    tts = []
    for spec in cfg.tts:
        engine, seconds[f"tts.{spec.name}"] = _build("tts", spec, cfg.default_threads)
        tts.append(engine)
    responder, seconds["responder"] = _build("responder", cfg.responder, cfg.default_threads)
    for name, took in seconds.items():
        log.info("engine loaded", extra={"engine": name, "seconds": round(took, 3)})
    return Engines(vad, asr, tts, responder, cfg.default_voice, load_seconds=seconds)


class Runtime:
    """Owns the engines, the executor and the stages for one server process."""

    def __init__(self, settings: Settings, engines: Engines | None = None) -> None:
        self.settings = settings
        self._engines = engines
        ex = settings.pipeline.executor
        self.executor = AdaptiveExecutor(
            min_workers=ex.min_workers, max_workers=ex.max_workers, idle_release_s=ex.idle_release_s
        )
        self.stages: dict[str, EngineStage] = {}
        self.metrics = Metrics()
        self.metrics.watch(self)
        self.active_sessions = 0
        self.load_error: str | None = None

    @classmethod
    def from_engines(cls, settings: Settings, engines: Engines) -> Runtime:
        runtime = cls(settings, engines)
        return runtime

    @property
    def ready(self) -> bool:
        return self._engines is not None

    @property
    def engines(self) -> Engines:
        if self._engines is None:
            raise VoxError(ErrorCode.NOT_READY, "models are still loading; retry shortly")
        return self._engines

    def stage(self, name: str) -> EngineStage:
        """The shared stage for vad/asr/responder/tts, created on the running loop."""
        found = self.stages.get(name)
        if found is None:
            cfg = getattr(self.settings.pipeline, name)
            found = EngineStage(name, cfg.concurrency, cfg.timeout_s, self.executor)
            found.on_latency = self.metrics.observe_stage
            self.stages[name] = found
        return found

    async def load(self) -> None:
        """Load the configured engines off the event loop, so /healthz answers meanwhile."""
        if self._engines is not None:
            return
        started = time.perf_counter()
        try:
            self._engines = await asyncio.to_thread(load_engines, self.settings)
            log.info(
                "models loaded; ready",
                extra={
                    "seconds": round(time.perf_counter() - started, 3),
                    "load_seconds": {
                        name: round(took, 3) for name, took in self._engines.load_seconds.items()
                    },
                },
            )
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("engine loading failed", extra={"error": self.load_error})
            raise

    async def aclose(self) -> None:
        """Close engines holding async resources (the OpenAI responder's HTTP client)."""
        if self._engines is not None:
            aclose = getattr(self._engines.responder, "aclose", None)
            if callable(aclose):
                await aclose()
        self.close()

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self._engines is not None:
            self._engines.close()

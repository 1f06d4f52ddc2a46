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

from voxserve.cache.key import EngineFingerprint
from voxserve.cache.prewarm import Prewarmer, PrewarmItem, read_sentences
from voxserve.cache.tts_cache import TtsCache
from voxserve.config import EngineSpec, Settings
from voxserve.engines.base import AsrEngine, Responder, TtsEngine, VadEngine, close_engine
from voxserve.engines.registry import engine_class
from voxserve.errors import ErrorCode, VoxError
from voxserve.observe.loop_watchdog import LoopWatchdog
from voxserve.observe.metrics import Metrics
from voxserve.observe.tracing import make_tracer
from voxserve.pipeline.asr_batch import AsrBatcher
from voxserve.pipeline.executor import AdaptiveExecutor
from voxserve.pipeline.fallback import FallbackPhrase
from voxserve.pipeline.stage import EngineStage
from voxserve.pipeline.tts_health import TtsHealth
from voxserve.pipeline.vad_batch import VadBatcher
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


def _log_prewarm(done: int, total: int) -> None:
    """Prewarm progress in the log: every 100 sentences and at the end."""
    if done == total or done % 100 == 0:
        log.info("tts cache prewarm", extra={"done": done, "total": total})


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
        self._vad_batcher: VadBatcher | None = None
        self._asr_batcher: AsrBatcher | None = None
        # Set when `ready` turns true: what readiness watchers (gRPC health) await.
        self.loaded = asyncio.Event()
        self.cache = TtsCache(settings.cache) if settings.cache.enabled else None
        self.prewarmer = (
            Prewarmer(self.cache, self._prewarm_one, _log_prewarm) if self.cache else None
        )
        degrade = settings.tts.degrade
        self.tts_health = TtsHealth(degrade)
        self.fallback = FallbackPhrase(degrade.fallback_text if degrade.enabled else None)
        self._fingerprints: dict[int, EngineFingerprint] = {}
        self._ready = False
        self.metrics = Metrics(
            enabled=settings.metrics_enabled, profile_window=settings.profile_window
        )
        self.tracer = make_tracer(settings.otel_enabled)
        self.metrics.watch(self)
        self.active_sessions = 0
        self.load_error: str | None = None
        self.watchdog: LoopWatchdog | None = None  # set by the app while it serves

    @classmethod
    def from_engines(cls, settings: Settings, engines: Engines) -> Runtime:
        runtime = cls(settings, engines)
        return runtime

    @property
    def ready(self) -> bool:
        """Engines loaded, the cache read from disk, the fallback phrase made."""
        return self._ready

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

    def vad_batcher(self) -> VadBatcher:
        """The one VAD batcher of this process (all sessions' VAD work goes through it)."""
        if self._vad_batcher is None:
            cfg = self.settings.pipeline
            self._vad_batcher = VadBatcher(
                self.engines.vad,
                self.stage("vad"),
                max_wait_ms=cfg.vad_batch_wait_ms,
                max_batch=cfg.vad_max_batch,
            )
            self._vad_batcher.on_batch = self.metrics.observe_batch
        return self._vad_batcher

    def asr_batcher(self) -> AsrBatcher | None:
        """The batcher for final transcriptions, or None when `pipeline.asr_batch_enabled`
        is off (finals then go to the ASR stage one at a time)."""
        cfg = self.settings.pipeline
        if not cfg.asr_batch_enabled:
            return None
        if self._asr_batcher is None:
            self._asr_batcher = AsrBatcher(
                self.engines.asr,
                self.stage("asr"),
                max_wait_ms=cfg.asr_batch_wait_ms,
                max_batch=cfg.asr_max_batch,
            )
            self._asr_batcher.on_batch = self.metrics.observe_batch
        return self._asr_batcher

    def fingerprint(self, engine: TtsEngine) -> EngineFingerprint:
        """What of `engine` goes into cache keys: its info, the options it was built with
        (from the config), and an optional `cache_fingerprint` string it declares."""
        found = self._fingerprints.get(id(engine))
        if found is None:
            options: dict[str, Any] = {}
            for spec in self.settings.engines.tts:
                if spec.name == engine.info.name:
                    options = spec.options
                    break
            extra = str(getattr(engine, "cache_fingerprint", ""))
            found = self._fingerprints[id(engine)] = EngineFingerprint.of(
                engine.info, options, extra
            )
        return found

    async def load(self) -> None:
        """Load the engines and read the TTS cache from disk, both off the event loop (so
        /healthz answers meanwhile) and at the same time; then make the fallback phrase.
        Ready after that; a prewarm file is then worked through in the background."""
        if self._ready:
            return
        started = time.perf_counter()
        cache = self.cache
        reading = asyncio.create_task(cache.load(), name="voxserve-load-cache") if cache else None
        try:
            if self._engines is None:
                self._engines = await asyncio.to_thread(load_engines, self.settings)
            if reading is not None:
                await reading
            await self._make_fallback()
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("engine loading failed", extra={"error": self.load_error})
            raise
        finally:
            if reading is not None and not reading.done():
                reading.cancel()
        self._ready = True
        self.loaded.set()
        log.info(
            "models loaded; ready",
            extra={
                "seconds": round(time.perf_counter() - started, 3),
                "load_seconds": {
                    name: round(took, 3) for name, took in self.engines.load_seconds.items()
                },
            },
        )
        self._start_prewarm_file()

    async def _make_fallback(self) -> None:
        """The fallback phrase in every voice, from the cache or made now (before ready:
        a degraded server must always have it)."""
        from voxserve.pipeline.synthesis import cache_speech  # imports this module

        text = self.fallback.text
        if text is None:
            return
        rate = self.settings.tts.output_sample_rate
        for voice in self.engines.voices():
            try:
                samples, _ = await cache_speech(self, text, voice=voice.id, sample_rate=rate)
            except VoxError as exc:
                log.warning(
                    "fallback phrase failed", extra={"voice": voice.id, "error": exc.code.value}
                )
                continue
            if samples.size:
                self.fallback.add(voice.id, rate, samples)

    def _start_prewarm_file(self) -> None:
        path = self.settings.cache.prewarm_file
        if path is None or self.prewarmer is None:
            return
        try:
            texts = read_sentences(path)
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("prewarm file unreadable", extra={"path": str(path), "error": str(exc)})
            return
        log.info("prewarming the tts cache", extra={"sentences": len(texts)})
        try:
            self.prewarmer.submit([PrewarmItem(text) for text in texts])
        except ValueError as exc:
            log.warning("prewarm file too long", extra={"error": str(exc)})

    async def _prewarm_one(self, item: PrewarmItem) -> bool:
        from voxserve.pipeline.synthesis import cache_speech  # imports this module

        _, made = await cache_speech(
            self,
            item.text,
            voice=item.voice,
            speed=item.speed,
            sample_rate=item.sample_rate,
            polite=True,
        )
        return made

    async def aclose(self) -> None:
        """Stop prewarming and syntheses in progress, write the cache out, and close engines
        holding async resources (the OpenAI responder's HTTP client)."""
        if self.prewarmer is not None:
            await self.prewarmer.aclose()
        if self.cache is not None:
            await self.cache.aclose()
        if self._engines is not None:
            aclose = getattr(self._engines.responder, "aclose", None)
            if callable(aclose):
                await aclose()
        self.close()

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self._engines is not None:
            self._engines.close()

"""One loaded set of engines (`Engines`) and how it is built from the config (`load_engines`).

The runtime loads a set at start-up and on every hot reload (pipeline/generations.py holds
each set with the batchers built on it); `serve --workers N` builds the fork-safe engines
once in the parent (`build_engine`) and hands them to every worker's load as `preloaded`.
"""

from __future__ import annotations

import inspect
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from voxserve.config import EngineSpec, Settings
from voxserve.engines.base import AsrEngine, Responder, TtsEngine, VadEngine, close_engine
from voxserve.engines.micro_wakeword import WakeEngine, load_wake
from voxserve.engines.registry import ENGINE_KINDS, engine_class, instantiate
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.types import Voice

__all__ = ["ENGINE_KINDS", "Engines", "build_engine", "load_engines"]

log = logging.getLogger(__name__)


@dataclass
class Engines:
    vad: VadEngine
    asr: AsrEngine
    tts: list[TtsEngine]
    responder: Responder
    default_voice: str
    load_seconds: dict[str, float] = field(default_factory=dict)
    wake: WakeEngine | None = None  # wake.enabled (engines/micro_wakeword.py)
    _voices: dict[str, tuple[Voice, TtsEngine]] = field(default_factory=dict)
    _aliases: dict[str, tuple[Voice, TtsEngine]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.refresh_voices()
        if self.default_voice not in self._voices and self._voices:
            self.default_voice = next(iter(self._voices))

    def refresh_voices(self) -> None:
        """Read the engines' voices again: one added or removed while serving (a cosyvoice
        zero-shot voice, server/http/admin_voices.py). The maps are swapped whole, so a
        lookup on another thread sees the old set or the new one."""
        voices: dict[str, tuple[Voice, TtsEngine]] = {}
        aliases: dict[str, tuple[Voice, TtsEngine]] = {}
        for engine in self.tts:
            for voice in engine.voices():
                voices.setdefault(voice.id, (voice, engine))
        for voice, engine in list(voices.values()):
            for alias in voice.aliases:
                aliases.setdefault(alias, (voice, engine))
        self._voices, self._aliases = voices, aliases

    def voices(self) -> list[Voice]:
        return [voice for voice, _ in self._voices.values()]

    def voice(self, voice_id: str | None) -> tuple[Voice, TtsEngine]:
        """Resolve a voice id (None = default) or raise UNKNOWN_VOICE listing the valid ids."""
        key = voice_id or self.default_voice
        found = self._voices.get(key) or self._aliases.get(key)
        if found is None:
            valid = ", ".join(sorted(self._voices))
            raise VoxError(
                ErrorCode.UNKNOWN_VOICE, f"unknown voice {quoted(key)}; valid voices: {valid}"
            )
        return found

    def check_language(self, language: str | None) -> str | None:
        if language is None or language in self.asr.languages:
            return language
        valid = ", ".join(self.asr.languages)
        raise VoxError(
            ErrorCode.UNKNOWN_LANGUAGE, f"language {quoted(language)} is not served; valid: {valid}"
        )

    def session_language(self, language: str | None) -> str | None:
        """A session's language: the one asked for (checked), else the ASR engine's only
        language, else None: a multilingual engine detects it per utterance."""
        checked = self.check_language(language)
        if checked is not None or len(self.asr.languages) > 1:
            return checked
        return self.asr.languages[0]

    def close(self) -> None:
        for engine in (self.vad, self.asr, *self.tts, self.responder):
            close_engine(engine)
        if self.wake is not None:
            close_engine(self.wake)


def build_engine(
    kind: str, spec: EngineSpec, default_threads: int, parallel: int | None = None
) -> tuple[Any, float]:
    """Construct one engine; returns it and the seconds it took. `parallel`: the stage's
    limit, given to an engine whose constructor takes `num_workers` (Whisper: CTranslate2
    replicas, sharing the weights) unless its options say otherwise, so the stage's slots
    are calls the engine really runs at once: with one replica a live final queued inside
    CTranslate2 behind an upload's window however many slots the stage had (1.75 s median
    beside a 28 s window, 0.26 s with two replicas)."""
    cls = engine_class(kind, spec.name)
    options = dict(spec.options)
    started = time.perf_counter()
    if kind != "responder" and "threads" not in options and _takes(cls, "threads"):
        options["threads"] = default_threads
    if parallel is not None and "num_workers" not in options and _takes(cls, "num_workers"):
        options["num_workers"] = parallel
    engine = instantiate(kind, spec.name, cls, options)
    return engine, time.perf_counter() - started


def _takes(cls: Any, name: str) -> bool:
    try:
        return name in inspect.signature(cls).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin, a C type)
        return False


def load_engines(
    settings: Settings,
    *,
    kinds: tuple[str, ...] = ENGINE_KINDS,
    current: Engines | None = None,
    preloaded: dict[str, Any] | None = None,
) -> Engines:
    """Construct the configured engines (blocking; seconds). Kinds not in `kinds` are
    taken from `current` (a reload of some kinds); `preloaded` ("vad", "asr", "tts.NAME",
    "responder") were built before the worker processes forked and are used as they are."""
    cfg = settings.engines
    have = dict(preloaded or {})
    if current is not None:
        have.setdefault("vad", current.vad)
        have.setdefault("asr", current.asr)
        have.setdefault("responder", current.responder)
        for engine in current.tts:
            have.setdefault(f"tts.{engine.info.name}", engine)
    seconds: dict[str, float] = {}

    def one(kind: str, key: str, spec: EngineSpec) -> Any:
        kept = have.get(key)
        if kept is not None and (kind not in kinds or key in (preloaded or {})):
            return kept
        parallel = settings.pipeline.asr.concurrency if kind == "asr" else None
        engine, seconds[key] = build_engine(kind, spec, cfg.default_threads, parallel)
        return engine

    vad = one("vad", "vad", cfg.vad)
    asr = one("asr", "asr", cfg.asr)
    tts = [one("tts", f"tts.{spec.name}", spec) for spec in cfg.tts]
    responder = one("responder", "responder", cfg.responder)
    wake = current.wake if current is not None else load_wake(settings.wake, seconds)
    for name, took in seconds.items():
        log.info("engine loaded", extra={"engine": name, "seconds": round(took, 3)})
    return Engines(vad, asr, tts, responder, cfg.default_voice, load_seconds=seconds, wake=wake)

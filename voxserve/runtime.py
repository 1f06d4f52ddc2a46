"""The process-wide runtime: engines loaded once and shared, the executor, the stage limits.

Everything a transport needs to serve a session hangs off one `Runtime`; tests build one
with fake engines (`Runtime.from_engines`) to exercise the pipeline alone. Engines live in
generations (`generations.py`): `reload()` loads a new set while streams run; a session
sees the runtime through `session_view()`, bound to the generation it started on.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from voxserve.audio.pool import BufferPool, pool_buffers
from voxserve.cache.key import EngineFingerprint
from voxserve.cache.prewarm import Prewarmer, PrewarmItem, read_sentences
from voxserve.cache.tts_cache import TtsCache
from voxserve.config import EngineSpec, Settings
from voxserve.engines.base import AsrEngine, Responder, TtsEngine, VadEngine, close_engine
from voxserve.engines.registry import engine_class
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.generations import Generation, Lease, close_when_idle
from voxserve.observe import gc_control
from voxserve.observe.loop_watchdog import LoopWatchdog
from voxserve.observe.metrics import Metrics
from voxserve.observe.tracing import make_tracer
from voxserve.pipeline.asr_batch import AsrBatcher
from voxserve.pipeline.drain import Drain
from voxserve.pipeline.executor import AdaptiveExecutor
from voxserve.pipeline.fallback import FallbackPhrase
from voxserve.pipeline.flow import FlowMonitor
from voxserve.pipeline.memory_guard import MemoryGuard, threshold_bytes
from voxserve.pipeline.stage import EngineStage
from voxserve.pipeline.tts_health import TtsHealth
from voxserve.pipeline.vad_batch import VadBatcher
from voxserve.types import FRAME_SAMPLES, Voice

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

    def close(self) -> None:
        for engine in (self.vad, self.asr, *self.tts, self.responder):
            close_engine(engine)


ENGINE_KINDS = ("vad", "asr", "tts", "responder")


def _build(
    kind: str, spec: EngineSpec, default_threads: int, parallel: int | None = None
) -> tuple[Any, float]:
    """Construct one engine. `parallel`: the stage's limit, given to an engine whose
    constructor takes `num_workers` (Whisper: CTranslate2 replicas, sharing the weights)
    unless its options say otherwise, so the stage's slots are calls the engine really runs
    at once: with one replica a live final queued inside CTranslate2 behind an upload's
    window however many slots the stage had (1.75 s median beside a 28 s window, 0.26 s
    with two replicas)."""
    cls = engine_class(kind, spec.name)
    options = dict(spec.options)
    started = time.perf_counter()
    if kind != "responder" and "threads" not in options:
        options["threads"] = default_threads
    if parallel is not None and "num_workers" not in options and _takes(cls, "num_workers"):
        options["num_workers"] = parallel
    engine = cls(**options)
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
        engine, seconds[key] = _build(kind, spec, cfg.default_threads, parallel)
        return engine

    vad = one("vad", "vad", cfg.vad)
    asr = one("asr", "asr", cfg.asr)
    tts = [one("tts", f"tts.{spec.name}", spec) for spec in cfg.tts]
    responder = one("responder", "responder", cfg.responder)
    for name, took in seconds.items():
        log.info("engine loaded", extra={"engine": name, "seconds": round(took, 3)})
    return Engines(vad, asr, tts, responder, cfg.default_voice, load_seconds=seconds)


def _log_prewarm(done: int, total: int) -> None:
    """Prewarm progress in the log: every 100 sentences and at the end."""
    if done == total or done % 100 == 0:
        log.info("tts cache prewarm", extra={"done": done, "total": total})


class Runtime:
    """Owns the engines, the executor and the stages for one server process."""

    def __init__(
        self,
        settings: Settings,
        engines: Engines | None = None,
        *,
        preloaded: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self._preloaded = preloaded  # engines built before fork (`serve --workers N`)
        ex = settings.pipeline.executor
        self.executor = AdaptiveExecutor(
            min_workers=ex.min_workers, max_workers=ex.max_workers, idle_release_s=ex.idle_release_s
        )
        self.stages: dict[str, EngineStage] = {}
        # Credit windows and load shedding (ticks while the app serves), graceful drain.
        self.flow = FlowMonitor(settings.flow, self.stages)
        self.drain = Drain()
        self.memory_guard = MemoryGuard(
            threshold_bytes(settings.limits, workers=settings.workers),
            retry_after_s=settings.flow.retry_after_s,
        )
        self._generation: Generation | None = None
        self.generations: list[Generation] = []  # current and retired, until closed
        self._closers: set[asyncio.Task[None]] = set()
        self._reload_lock: asyncio.Lock | None = None
        self.reloads = 0
        if engines is not None:
            self._set_generation(engines)
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
        self.pool = BufferPool(
            pool_buffers(settings), settings.pipeline.ring_frames * FRAME_SAMPLES
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
        """The current generation's engines (what a new session or request uses)."""
        return self.generation.engines

    @property
    def generation(self) -> Generation:
        if self._generation is None:
            raise VoxError(ErrorCode.NOT_READY, "models are still loading; retry shortly")
        return self._generation

    def _set_generation(self, engines: Engines) -> Generation:
        number = self._generation.number + 1 if self._generation is not None else 1
        generation = Generation(number, engines)
        generation.on_unused = self._close_generation
        old, self._generation = self._generation, generation
        self.generations.append(generation)
        if old is not None:
            old.retire()
        return generation

    def _close_generation(self, generation: Generation) -> None:
        """A retired generation lost its last session: close it off the hot path."""
        if generation in self.generations:
            self.generations.remove(generation)
        grace = max(
            (getattr(self.settings.pipeline, k).timeout_s for k in ("vad", "asr", "tts")),
            default=15.0,
        )

        def running() -> int:
            return sum(stage.running for stage in self.stages.values())

        def keep() -> Engines | None:
            return self._generation.engines if self._generation is not None else None

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a collected session outside it): close now
            generation.close_batchers()
            generation.close_engines(keep())
            return
        task = loop.create_task(
            close_when_idle(generation, keep, running, grace), name="voxserve-close-generation"
        )
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)

    def lease(self) -> Lease:
        """Hold the current generation (a session holds it from start to end)."""
        return self.generation.lease()

    def session_view(self, lease: Lease) -> Runtime:
        """This runtime as a session sees it: the engines and batchers of its generation."""
        return SessionRuntime(self, lease)

    async def reload(self, kinds: tuple[str, ...] = ENGINE_KINDS) -> Generation:
        """Load new engines (all, or `kinds`) off the loop and make them current. Live
        sessions finish on the generation they started on; it is closed after them. A
        failed load leaves the current generation serving and raises."""
        unknown = [kind for kind in kinds if kind not in ENGINE_KINDS]
        if unknown or not kinds:
            valid = ", ".join(ENGINE_KINDS)
            raise VoxError(ErrorCode.INVALID_PARAMETER, f"engine kinds to reload: {valid}")
        if self._reload_lock is None:
            self._reload_lock = asyncio.Lock()
        async with self._reload_lock:  # one reload at a time; a second waits its turn
            current = self.generation
            started = time.perf_counter()
            try:
                engines = await asyncio.to_thread(
                    load_engines, self.settings, kinds=kinds, current=current.engines
                )
            except Exception as exc:
                self.metrics.engine_reloads.labels("failed").inc()
                log.error("engine reload failed", extra={"error": f"{type(exc).__name__}"})
                raise VoxError(
                    ErrorCode.INTERNAL, f"engine reload failed ({type(exc).__name__}: {exc})"
                ) from exc
            self._fingerprints.clear()
            generation = self._set_generation(engines)
            self.reloads += 1
            self.metrics.engine_reloads.labels("ok").inc()
            # No gc.freeze() here: live sessions would be frozen with the new engines, and
            # the cycle collector never frees frozen objects.
            log.info(
                "engines reloaded",
                extra={
                    "generation": generation.number,
                    "kinds": list(kinds),
                    "seconds": round(time.perf_counter() - started, 3),
                    "previous_sessions": current.sessions,
                },
            )
            return generation

    def stage(self, name: str) -> EngineStage:
        """The shared stage for vad/asr/responder/tts, created on the running loop."""
        found = self.stages.get(name)
        if found is None:
            cfg = getattr(self.settings.pipeline, name)
            pipeline = self.settings.pipeline
            found = EngineStage(
                name,
                cfg.concurrency,
                cfg.timeout_s,
                self.executor,
                edf=pipeline.edf,
                inline_below_s=pipeline.inline_below_us / 1e6,
                bulk_slots=cfg.bulk_slots,
            )
            found.on_latency = self.metrics.observe_stage
            self.stages[name] = found
        return found

    def vad_batcher(self) -> VadBatcher:
        """The current generation's VAD batcher (all its sessions' VAD work goes through it)."""
        return self._vad_batcher_of(self.generation)

    def asr_batcher(self) -> AsrBatcher | None:
        """The current generation's batcher for final transcriptions, or None when
        `pipeline.asr_batch_enabled` is off (finals then go to the ASR stage one at a time)."""
        return self._asr_batcher_of(self.generation)

    def _vad_batcher_of(self, generation: Generation) -> VadBatcher:
        if generation.vad_batcher is None:
            cfg = self.settings.pipeline
            generation.vad_batcher = VadBatcher(
                generation.engines.vad,
                self.stage("vad"),
                max_wait_ms=cfg.vad_batch_wait_ms,
                max_batch=cfg.vad_max_batch,
            )
            generation.vad_batcher.on_batch = self.metrics.observe_batch
        return generation.vad_batcher

    def _asr_batcher_of(self, generation: Generation) -> AsrBatcher | None:
        cfg = self.settings.pipeline
        if not cfg.asr_batch_enabled:
            return None
        if generation.asr_batcher is None:
            generation.asr_batcher = AsrBatcher(
                generation.engines.asr,
                self.stage("asr"),
                max_wait_ms=cfg.asr_batch_wait_ms,
                max_batch=cfg.asr_max_batch,
                gather_when_busy=cfg.asr_batch_gather_busy,
            )
            generation.asr_batcher.on_batch = self.metrics.observe_batch
        return generation.asr_batcher

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
            if self._generation is None:
                engines = await asyncio.to_thread(
                    load_engines, self.settings, preloaded=self._preloaded
                )
                self._preloaded = None
                self._set_generation(engines)
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
        gc_control.after_load(self.settings.gc)
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
        for task in list(self._closers):
            task.cancel()
        if self._closers:
            await asyncio.gather(*self._closers, return_exceptions=True)
        for generation in self.generations:
            aclose = getattr(generation.engines.responder, "aclose", None)
            if callable(aclose):
                await aclose()
        self.close()

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        for generation in self.generations:
            generation.close_batchers()
            generation.close_engines()
        self.generations.clear()


class SessionRuntime(Runtime):
    """The runtime seen by one session: everything is the shared runtime's (looked up on
    it), except the engines and batchers, which are those of the session's generation."""

    _shared: Runtime
    _lease: Lease

    def __init__(self, runtime: Runtime, lease: Lease) -> None:  # shares; builds nothing
        object.__setattr__(self, "_shared", runtime)
        object.__setattr__(self, "_lease", lease)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._shared, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._shared, name, value)  # counters and the like live on the shared one

    @property
    def engines(self) -> Engines:
        return self._lease.generation.engines

    @property
    def generation(self) -> Generation:
        return self._lease.generation

    def vad_batcher(self) -> VadBatcher:
        return self._shared._vad_batcher_of(self._lease.generation)

    def asr_batcher(self) -> AsrBatcher | None:
        return self._shared._asr_batcher_of(self._lease.generation)

    def stage(self, name: str) -> EngineStage:
        return self._shared.stage(name)

    def fingerprint(self, engine: TtsEngine) -> EngineFingerprint:
        return self._shared.fingerprint(engine)


def process_stats() -> dict[str, int]:
    """Threads and open fds of this process (Linux /proc; -1 elsewhere), for leak checks."""
    try:
        fds = len(os.listdir("/proc/self/fd"))
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        return {"threads": -1, "fds": -1}
    return {"threads": threads, "fds": fds}

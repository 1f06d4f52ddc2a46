"""The process-wide runtime: the composition root of one server process.

It builds the parts (engine generations, stages, executor, cache, flow control, metrics)
and hands them out: a session gets a `SessionContext` (pipeline/context.py) bound to the
generation it started on; one-shot recognition and synthesis are given the runtime itself,
as the narrow `EngineContext` / `SpeechContext` they read. Tests build one with fake engines
(`Runtime.from_engines`) to exercise the pipeline alone. `reload()` loads a new generation of
engines while streams run (pipeline/generations.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from voxserve.audio.pool import BufferPool, pool_buffers
from voxserve.cache.fingerprints import EngineFingerprints
from voxserve.cache.prewarm import Prewarmer
from voxserve.cache.tts_cache import TtsCache
from voxserve.config import Settings
from voxserve.engines.loaded import ENGINE_KINDS, Engines, load_engines
from voxserve.engines.registry import EngineConfigError
from voxserve.errors import ErrorCode, VoxError
from voxserve.observe import gc_control
from voxserve.observe.loop_watchdog import LoopWatchdog
from voxserve.observe.metrics import Metrics
from voxserve.observe.tracing import make_tracer
from voxserve.pipeline.context import SessionContext, SpeechParts
from voxserve.pipeline.drain import Drain
from voxserve.pipeline.fallback import FallbackPhrase
from voxserve.pipeline.generations import (
    Batching,
    Generation,
    Lease,
    close_when_idle,
    until_idle,
)
from voxserve.pipeline.models.table import ModelTable
from voxserve.pipeline.recognition.audio_budget import DecodedAudioBudget
from voxserve.pipeline.scheduling.executor import AdaptiveExecutor
from voxserve.pipeline.scheduling.flow import FlowMonitor
from voxserve.pipeline.scheduling.memory_guard import MemoryGuard, threshold_bytes
from voxserve.pipeline.scheduling.stages import Stages
from voxserve.pipeline.scheduling.tts_health import TtsHealth
from voxserve.pipeline.scheduling.work_pools import WorkPools
from voxserve.pipeline.synthesis.warmup import (
    log_prewarm,
    make_fallback,
    prewarm_one,
    start_prewarm_file,
)
from voxserve.types import FRAME_SAMPLES

log = logging.getLogger(__name__)

CLOSE_GRACE_S = 2.0  # at shutdown, how long model calls still running may take to end


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
        self.metrics = Metrics(
            enabled=settings.metrics_enabled, profile_window=settings.profile_window
        )
        ex = settings.pipeline.executor
        self.executor = AdaptiveExecutor(
            min_workers=ex.min_workers, max_workers=ex.max_workers, idle_release_s=ex.idle_release_s
        )
        self.stages = Stages(settings.pipeline, self.executor, self.metrics.observe_stage)
        # Credit windows and load shedding (ticks while the app serves), graceful drain.
        self.flow = FlowMonitor(settings.flow, self.stages)
        self.drain = Drain()
        self.memory_guard = MemoryGuard(
            threshold_bytes(settings.limits, workers=settings.workers),
            retry_after_s=settings.flow.retry_after_s,
        )
        # Blocking work that is not a model call, one bounded pool per class (decode,
        # encode, files): a flood of one never delays another's first byte.
        self.pools = WorkPools.for_this_machine()
        self.upload_budget = DecodedAudioBudget(
            settings.limits.max_decoded_audio_bytes,
            memory_guard=self.memory_guard,
            retry_after_s=settings.flow.retry_after_s,
        )
        self._batching = Batching(
            settings.pipeline,
            self.stages,
            self.metrics.observe_batch,
            bulk_batch_s=settings.asr.bulk_batch_s,
            max_bulk_batch=settings.asr.bulk_max_batch,
        )
        self._generation: Generation | None = None
        self.generations: list[Generation] = []  # current and retired, until closed
        self._closers: set[asyncio.Task[None]] = set()
        self._retiring: set[Generation] = set()  # retired, unused, their engines closing
        self._reload_lock: asyncio.Lock | None = None
        self.reloads = 0
        # Named models chosen per request ([models]): loaded on first use, LRU and TTL.
        self.models = ModelTable(
            settings,
            self._batching,
            generation=lambda: self.generation,
            running_work=self.stages.running,
            close_grace_s=max(settings.pipeline.asr.timeout_s, settings.pipeline.tts.timeout_s),
        )
        if engines is not None:
            self._set_generation(engines)
        # Set when `ready` turns true: what readiness watchers (gRPC health) await.
        self.loaded = asyncio.Event()
        self.cache = TtsCache(settings.cache) if settings.cache.enabled else None
        self.prewarmer = (
            Prewarmer(self.cache, partial(prewarm_one, self), log_prewarm) if self.cache else None
        )
        degrade = settings.tts.degrade
        self.tts_health = TtsHealth(degrade)
        self.speech = SpeechParts(
            cache=self.cache,
            fingerprints=EngineFingerprints(settings.engines.tts),
            health=self.tts_health,
            fallback=FallbackPhrase(degrade.fallback_text if degrade.enabled else None),
            memory_guard=self.memory_guard,
            executor=self.executor,
        )
        self._ready = False
        self.pool = BufferPool(
            pool_buffers(settings), settings.pipeline.ring_frames * FRAME_SAMPLES
        )
        self.tracer = make_tracer(settings.otel_enabled)
        self.metrics.watch(self)
        self.active_sessions = 0
        self.load_error: str | None = None
        # A configuration error found while loading (EngineConfigError): the server stops
        # and `serve` exits 2 with it (`stop_for`); `on_fatal` is the server's stop.
        self.fatal: Exception | None = None
        self.on_fatal: Callable[[], None] | None = None
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
        generation = Generation(number, engines, self._batching)
        generation.on_unused = self._close_generation
        old, self._generation = self._generation, generation
        self.generations.append(generation)
        self.models.bind_defaults(engines)  # the default ASR's own model name means it
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

        def keep() -> list[Engines]:  # what the generations not closed yet use
            others = [*self.generations, *self._retiring]
            return [g.engines for g in others if g is not generation and not g.closed]

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a collected session outside it): close now
            generation.close_batchers()
            generation.close_engines(keep())
            return
        task = loop.create_task(
            close_when_idle(generation, keep, self.stages.running, grace),
            name="voxserve-close-generation",
        )
        self._closers.add(task)
        self._retiring.add(generation)  # still holding its engines until the task ends
        task.add_done_callback(self._closers.discard)
        task.add_done_callback(lambda _: self._retiring.discard(generation))

    def lease(self) -> Lease:
        """Hold the current generation (a session holds it from start to end)."""
        return self.generation.lease()

    def session_context(self, model: str | None = None) -> SessionContext:
        """What a new session is given: the shared parts, and a lease on the current
        generation (its engines and batchers) that the session releases at its end; with
        `model`, on a view of it with that ASR model (already loaded: the transport awaited
        `models.lease(asr=model)` and holds it until the session has its own lease)."""
        lease = self.models.lease_now(asr=model) if model else self.lease()
        return SessionContext(
            settings=self.settings,
            metrics=self.metrics,
            stages=self.stages,
            speech=self.speech,
            pool=self.pool,
            flow=self.flow,
            tracer=self.tracer,
            lease=lease,
            models=self.models,
        )

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
            self.speech.fingerprints.reset(self.settings.engines.tts)
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
            # A bad [models] entry stops `serve` (EngineConfigError) before anything loads.
            await asyncio.to_thread(self.models.check)
            if self._generation is None:
                engines = await _load_in_daemon_thread(
                    partial(load_engines, self.settings, preloaded=self._preloaded)
                )
                self._preloaded = None
                self._set_generation(engines)
            if reading is not None:
                await reading
            await make_fallback(self)
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, EngineConfigError):  # that one `serve` says (stop_for)
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
        path = self.settings.cache.prewarm_file
        if path is not None and self.prewarmer is not None:
            start_prewarm_file(self.prewarmer, path)

    def stop_for(self, error: Exception) -> None:
        """End the server because of `error` (a bad engine option found while loading):
        `serve` raises it once the server has stopped, one line and exit 2, instead of
        serving a /readyz that never turns 200."""
        self.fatal = error
        if self.on_fatal is not None:
            self.on_fatal()

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
        await until_idle(self.stages.running, CLOSE_GRACE_S)  # a responder call included
        responders = {id(g.engines.responder): g.engines.responder for g in self.generations}
        for responder in responders.values():  # one shared by generations is closed once
            aclose = getattr(responder, "aclose", None)
            if callable(aclose):
                await aclose()
        self.close()

    def close(self) -> None:
        self.models.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.pools.shutdown()
        # Each keeps what a generation not yet closed shares: an engine is closed once.
        remaining = [g for g in self._retiring if not g.closed] + list(self.generations)
        while remaining:
            generation = remaining.pop(0)
            generation.close_batchers()
            generation.close_engines([live.engines for live in remaining])
        self.generations.clear()


class Chosen:
    """What one-shot work (an upload, a speech request) reads when its request chose a
    model: the runtime's parts, and the engines of the generation `held` is on (a view with
    the chosen model). Recognition takes its own lease on that generation (`lease`); the
    route keeps `held` until the work has it (the model stays loaded meanwhile)."""

    def __init__(self, runtime: Runtime, held: Lease) -> None:
        self.runtime = runtime
        self.held = held

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    @property
    def stages(self) -> Stages:
        return self.runtime.stages

    @property
    def metrics(self) -> Metrics:
        return self.runtime.metrics

    @property
    def speech(self) -> SpeechParts:
        return self.runtime.speech

    @property
    def engines(self) -> Engines:
        return self.held.generation.engines

    def lease(self) -> Lease:
        return self.held.generation.lease()


async def _load_in_daemon_thread(load: Callable[[], Engines]) -> Engines:
    """`load()` in a daemon thread: a server stopped while its models load exits at once
    (asyncio.to_thread's worker would hold the exit until the load ends), and what a
    cancelled load still made is closed."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Engines] = loop.create_future()

    def deliver(engines: Engines | None, error: BaseException | None) -> None:
        if done.cancelled():
            if engines is not None:
                engines.close()
        elif error is not None:
            done.set_exception(error)
        else:
            assert engines is not None
            done.set_result(engines)

    def run() -> None:
        engines: Engines | None = None
        error: BaseException | None = None
        try:
            engines = load()
        except BaseException as exc:  # the awaiting task's to raise
            error = exc
        try:
            loop.call_soon_threadsafe(deliver, engines, error)
        except RuntimeError:  # the loop is closed: nobody will use them
            if engines is not None:
                engines.close()

    threading.Thread(target=run, name="voxserve-load-engines", daemon=True).start()
    return await done

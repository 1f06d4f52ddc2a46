"""Engine generations: what makes a hot model swap safe.

Each load of the engines is one `Generation`. A session holds a `Lease` on the generation
that was current when it started and keeps using those engines (and that generation's
batchers) to its end, so a reload never changes the model under a live stream. A reload
makes a new generation current and retires the old one; the old one is closed once its last
lease is released (and, for model work already running in the executor, after a grace that
covers the longest stage timeout). The runtime makes the generations; a session is given
its lease (pipeline/context.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from voxserve.config import PipelineConfig
from voxserve.engines.base import close_engine
from voxserve.engines.loaded import Engines
from voxserve.pipeline.scheduling.asr_batch import AsrBatcher
from voxserve.pipeline.scheduling.stages import Stages
from voxserve.pipeline.scheduling.vad_batch import VadBatcher

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Batching:
    """What every generation builds its batchers from: the pipeline settings, the shared
    stages, and the metrics' observer of batch sizes."""

    cfg: PipelineConfig
    stages: Stages
    on_batch: Callable[[str, int], None] | None = None
    bulk_batch_s: float | None = None  # asr.bulk_batch_s: audio one bulk ASR batch holds
    max_bulk_batch: int | None = None  # asr.bulk_max_batch: windows one bulk batch holds

    def vad(self, engines: Engines) -> VadBatcher:
        batcher = VadBatcher(
            engines.vad,
            self.stages.stage("vad"),
            max_wait_ms=self.cfg.vad_batch_wait_ms,
            max_batch=self.cfg.vad_max_batch,
        )
        batcher.on_batch = self.on_batch
        return batcher

    def asr(self, engines: Engines) -> AsrBatcher:
        batcher = AsrBatcher(
            engines.asr,
            self.stages.stage("asr"),
            max_wait_ms=self.cfg.asr_batch_wait_ms,
            max_batch=self.cfg.asr_max_batch,
            gather_when_busy=self.cfg.asr_batch_gather_busy,
            bulk_batch_s=self.bulk_batch_s,
            max_bulk_batch=self.max_bulk_batch,
        )
        batcher.on_batch = self.on_batch
        return batcher


class Generation:
    """One set of loaded engines, the batchers built on them, and the sessions using them."""

    def __init__(self, number: int, engines: Engines, batching: Batching) -> None:
        self.number = number
        self.engines = engines
        self._batching: Batching | None = batching
        self._vad_batcher: VadBatcher | None = None  # built on first use (needs the loop)
        self._asr_batcher: AsrBatcher | None = None
        self.sessions = 0  # live leases
        self.sessions_total = 0
        self.retired = False
        self.closed = False
        self.loaded_at = time.time()
        # Called once the generation is retired and unused (the runtime closes it).
        self.on_unused: Callable[[Generation], None] | None = None

    def vad_batcher(self) -> VadBatcher:
        """This generation's VAD batcher (all its sessions' VAD work goes through it)."""
        if self._vad_batcher is None:
            assert self._batching is not None, "a closed generation makes no batchers"
            self._vad_batcher = self._batching.vad(self.engines)
        return self._vad_batcher

    def asr_batcher(self) -> AsrBatcher | None:
        """This generation's batcher for final transcriptions, or None when
        `pipeline.asr_batch_enabled` is off (finals then go to the ASR stage one at a time)."""
        if self._asr_batcher is None:
            batching = self._batching
            assert batching is not None, "a closed generation makes no batchers"
            if not batching.cfg.asr_batch_enabled:
                return None
            self._asr_batcher = batching.asr(self.engines)
        return self._asr_batcher

    def lease(self) -> Lease:
        self.sessions += 1
        self.sessions_total += 1
        return Lease(self)

    def _release(self) -> None:
        self.sessions -= 1
        if self.retired and self.sessions == 0 and self.on_unused is not None:
            self.on_unused(self)

    def retire(self) -> None:
        """No new sessions start here; closed when the last lease is released."""
        self.retired = True
        if self.sessions == 0 and self.on_unused is not None:
            self.on_unused(self)

    def close_batchers(self) -> None:
        for batcher in (self._vad_batcher, self._asr_batcher):
            if batcher is not None:
                batcher.close()

    def close_engines(self, keep: Sequence[Engines] = ()) -> None:
        """Close every engine of this generation that none of `keep` (the generations still
        live) shares (a reload of some kinds carries the others over)."""
        if self.closed:
            return
        self.closed = True
        kept = {id(engine) for engines in keep for engine in _engine_list(engines)}
        for engine in _engine_list(self.engines):
            if id(engine) not in kept:
                close_engine(engine)
        # Drop every reference out of this generation: it may sit in gc's frozen
        # generation (the first load is frozen), which the cycle collector never scans,
        # so anything reachable from it would only be freed by reference counting.
        self.engines = _CLOSED
        self._vad_batcher = self._asr_batcher = None
        self._batching = None
        self.on_unused = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "generation": self.number,
            "sessions": self.sessions,
            "sessions_total": self.sessions_total,
            "retired": self.retired,
            "closed": self.closed,
            "loaded_at": self.loaded_at,
        }


class Lease:
    """A session's hold on one generation; released at the session's end, or when the
    session object is collected if it never ran (so a lease cannot leak)."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        self._finalizer = weakref.finalize(self, generation._release)

    @property
    def released(self) -> bool:
        return not self._finalizer.alive

    def release(self) -> None:
        self._finalizer()  # runs once; later calls do nothing

    async def aclose(self) -> None:
        """`release`, as a ClosingStream source (a response that holds a model to its end)."""
        self.release()

    def take_over(self, other: Lease) -> None:
        """Hold what `other` holds instead of what this lease held (released now), `other`
        spent: a session that chooses another model mid-way (a Realtime session.update)
        keeps its one lease object, which its parts read."""
        detached = other._finalizer.detach()
        if detached is None:
            raise ValueError("the lease taken over was released")
        _, release, args, kwargs = detached
        old = self._finalizer
        self.generation = other.generation
        self._finalizer = weakref.finalize(self, release, *args, **(kwargs or {}))
        old()


async def close_when_idle(
    generation: Generation,
    keep: Callable[[], Sequence[Engines]],
    running_work: Callable[[], int],
    grace_s: float,
) -> None:
    """Close a retired, unused generation: its batchers at once, its engines once no stage
    has work running (a cancelled session's model call may still be inside the engine) or
    after `grace_s` (the longest stage timeout), whichever comes first."""
    generation.close_batchers()
    with contextlib.suppress(asyncio.CancelledError):
        await until_idle(running_work, grace_s)
    if generation.closed:  # the runtime closed everything meanwhile (shutdown)
        return
    responder, kept = generation.engines.responder, keep()
    generation.close_engines(kept)
    aclose = getattr(responder, "aclose", None)  # async resources (an HTTP client)
    if callable(aclose) and all(engines.responder is not responder for engines in kept):
        await aclose()
    log.info(
        "engine generation closed",
        extra={"generation": generation.number, "sessions_total": generation.sessions_total},
    )


async def until_idle(running_work: Callable[[], int], grace_s: float) -> None:
    """Until no model call is running, or `grace_s` has passed: an engine is not closed
    under a call still inside it (a cancelled session's)."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not running_work():
            break
        await asyncio.sleep(0.05)  # a poll: stage slots signal no event per release


_CLOSED: Any = None  # what a closed generation's engines are: nothing


def _engine_list(engines: Engines) -> list[object]:
    wake = [engines.wake] if engines.wake is not None else []
    return [engines.vad, engines.asr, *engines.tts, engines.responder, *wake]

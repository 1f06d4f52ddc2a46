"""An engine stage: a concurrency limit shared by every session, a timeout, stage-named errors.

The limit counts work that is really running on the executor: when a caller times out or is
cancelled, a queued call is withdrawn, and a call already running keeps its slot until it
finishes, so abandoned model work can never pile up behind the limit's back.

Callers waiting for a slot are admitted earliest-deadline-first, not in arrival order: a
final transcript or a first TTS chunk someone is waiting for overtakes a partial or a long
reply's tail that has time to spare. Deadlines are absolute (`time.monotonic()`) and every
caller's deadline is finite (default: now + the stage timeout), so a queued item cannot
starve: later arrivals carry later deadlines, and its own turns earliest in time.
`edf=False` (`pipeline.edf`) admits in arrival order instead, to measure what EDF buys.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

from voxserve.errors import ErrorCode, VoxError

T = TypeVar("T")

# Priorities break ties between equal deadlines (lower goes first); bulk work also passes a
# late deadline. Deadlines, not priorities, decide the order, so nothing starves.
PRIORITY_LIVE = 0
PRIORITY_BULK = 10
WAIT_SMOOTHING = 0.2  # weight of the newest call in the smoothed queue wait


def deadline_in(seconds: float) -> float:
    """An absolute stage deadline `seconds` from now (the clock EngineStage orders by)."""
    return time.monotonic() + seconds


_Waiter = tuple[float, int, int, "asyncio.Future[None]"]  # deadline, priority, seq, handoff


class EngineStage:
    def __init__(
        self, name: str, concurrency: int, timeout_s: float, executor: Executor, *, edf: bool = True
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"stage {name}: concurrency must be >= 1")
        self.name = name
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self._executor = executor
        self.edf = edf  # False: first come, first served (deadlines still count `late`)
        self._free = concurrency  # slots nobody holds
        self._queue: list[_Waiter] = []  # heap; withdrawn waiters stay until popped
        self._seq = itertools.count()
        self._queued = 0  # callers queued for a slot
        # Batches' worth of requests a batcher holds back while the engine is busy
        # (pipeline/batcher.py): they wait as queued callers do, so they count in `waiting`.
        self.held = 0
        self.running = 0
        self.calls = 0
        self.timeouts = 0
        self.late = 0  # calls that got their slot after their deadline (flow pressure)
        self.queue_wait = 0.0  # seconds callers wait for a slot, smoothed (flow pressure)
        self.errors = 0
        self.on_latency: Callable[[str, float], None] | None = None

    @property
    def waiting(self) -> int:
        """Callers queued for a slot plus requests held by a batcher (the stage queue length)."""
        return self._queued + self.held

    async def run(
        self,
        fn: Callable[..., T],
        *args: object,
        timeout_s: float | None = None,
        deadline: float | None = None,
        priority: int = PRIORITY_LIVE,
        queued_at: float | None = None,
    ) -> T:
        """Run `fn(*args)` on the executor under this stage's limit and timeout.

        `deadline` (time.monotonic(), see deadline_in) orders the wait for a slot only; the
        timeout still bounds the whole call. Default: now + the timeout. `queued_at`
        (perf_counter) is when the work began waiting, if before this call (a held batch)."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        started = time.perf_counter()
        due = time.monotonic() + limit if deadline is None else deadline
        self.calls += 1
        try:
            async with asyncio.timeout(limit):
                await self._acquire(due, priority)
                now = time.monotonic()
                if now > due:
                    self.late += 1
                # Smoothed wait for a slot: the load signal admission and credit read.
                waited = time.perf_counter() - min(started, queued_at or started)
                self.queue_wait += (waited - self.queue_wait) * WAIT_SMOOTHING
                return await self._run_in_slot(fn, args)
        except TimeoutError:
            self.timeouts += 1
            raise VoxError(
                ErrorCode.STAGE_TIMEOUT,
                f"{self.name} did not answer within {limit:g} s",
                stage=self.name,
            ) from None
        finally:
            if self.on_latency is not None:
                self.on_latency(self.name, time.perf_counter() - started)

    async def _acquire(self, deadline: float, priority: int) -> None:
        """Take a free slot, or queue until `_pass_slot` hands one over (earliest first)."""
        if self._free > 0 and not self._queued:
            self._free -= 1
            return
        handoff: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        key = (deadline, priority) if self.edf else (0.0, 0)  # FIFO: the sequence decides
        heapq.heappush(self._queue, (*key, next(self._seq), handoff))
        self._queued += 1
        try:
            await handoff
        except asyncio.CancelledError:
            if handoff.done() and not handoff.cancelled():
                self._pass_slot()  # handed a slot and cancelled before using it: pass it on
            else:
                handoff.cancel()  # withdrawn: skipped when popped
            raise
        finally:
            self._queued -= 1

    def _pass_slot(self) -> None:
        """A slot came free: give it to the earliest-deadline live waiter, else keep it."""
        while self._queue:
            handoff = heapq.heappop(self._queue)[3]
            if not handoff.done():
                handoff.set_result(None)
                return
        self._free += 1

    def _release_slot(self) -> None:
        self.running -= 1
        self._pass_slot()

    async def _run_in_slot(self, fn: Callable[..., T], args: tuple[object, ...]) -> T:
        loop = asyncio.get_running_loop()
        self.running += 1
        try:
            future = self._executor.submit(fn, *args)
        except BaseException:
            self._release_slot()
            raise

        def release(_: object) -> None:
            # Runs (on a worker thread) when the work is really over: done, failed or
            # withdrawn before it started. Counters are only touched on the loop's thread.
            try:
                loop.call_soon_threadsafe(self._release_slot)
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                pass

        future.add_done_callback(release)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()  # withdraws it if it has not started yet
            raise
        except VoxError:
            self.errors += 1
            raise
        except ValueError as exc:
            # Engines raise ValueError for bad requests (unknown voice, bad speed, ...).
            self.errors += 1
            raise VoxError(ErrorCode.INVALID_PARAMETER, str(exc), stage=self.name) from exc
        except BaseException as exc:
            # Not only Exception: a SystemExit or other BaseException out of a model call (a
            # native library exiting, a torn-down worker) is this call's failure; let through,
            # asyncio would re-raise it out of the event loop and stop the server
            # (tests/faults).
            self.errors += 1
            raise VoxError(
                ErrorCode.ENGINE_ERROR,
                f"{self.name} engine failed ({type(exc).__name__})",
                stage=self.name,
            ) from exc

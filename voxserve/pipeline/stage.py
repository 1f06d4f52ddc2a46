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

Inline calls: handing a call to a worker thread and back costs the loop two wake-ups and
the worker one (36-46 µs to wake a thread on the project's VMs), more than a cheap engine's
whole call (an energy VAD's round, a tiny model). A caller whose engine allows it
(`inline_ok`: bounded CPU, no I/O, locks or sleeps; engines/base.py `inline_safe`) has its
call run on the event loop itself while the stage's smoothed cost of such calls is under
`inline_below_s` (`pipeline.inline_below_us`). The cost is measured on every such call,
inline (wall time: what the loop pays) or threaded (the worker's CPU time: its wall time
includes waiting for the loop's GIL), so an engine that grows dear goes back to the thread;
the first calls always take the thread, to be measured. An inline call holds its slot like
any other, and has no timeout to wait for: it is over before anything else runs.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import TypeVar

from voxserve.errors import ErrorCode, VoxError

T = TypeVar("T")

# Priorities break ties between equal deadlines (lower goes first); bulk work also passes a
# late deadline. Deadlines, not priorities, decide the order, so nothing starves.
PRIORITY_LIVE = 0
PRIORITY_BULK = 10
WAIT_SMOOTHING = 0.2  # weight of the newest call in the smoothed queue wait
COST_SMOOTHING = 0.2  # weight of the newest call in the smoothed cost of inline-able calls
MEASURED_BEFORE_INLINE = 3  # inline-able calls measured on the thread before any runs inline


def deadline_in(seconds: float) -> float:
    """An absolute stage deadline `seconds` from now (the clock EngineStage orders by)."""
    return time.monotonic() + seconds


_Waiter = tuple[float, int, int, "asyncio.Future[None]"]  # deadline, priority, seq, handoff


class EngineStage:
    def __init__(
        self,
        name: str,
        concurrency: int,
        timeout_s: float,
        executor: Executor,
        *,
        edf: bool = True,
        inline_below_s: float = 0.0,
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
        self.inline_below_s = inline_below_s  # 0: every call takes a worker thread
        self.inline_calls = 0  # calls run on the event loop (module docstring)
        self.cost_s = 0.0  # smoothed run time of inline-able calls, wherever they ran
        self._costed = 0  # inline-able calls measured so far
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
        inline_ok: bool = False,
    ) -> T:
        """Run `fn(*args)` on the executor under this stage's limit and timeout.

        `deadline` (time.monotonic(), see deadline_in) orders the wait for a slot only; the
        timeout still bounds the whole call. Default: now + the timeout. `queued_at`
        (perf_counter) is when the work began waiting, if before this call (a held batch).
        `inline_ok`: the engine allows its calls on the event loop (module docstring)."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        started = time.perf_counter()
        due = time.monotonic() + limit if deadline is None else deadline
        self.calls += 1
        try:
            if inline_ok and self._free > 0 and not self._queued and self._cheap():
                # A free slot and no thread: nothing to wait for, nothing to time out.
                self._free -= 1
                self._slot_taken(due, started, queued_at)
                return self._run_inline(fn, args)
            async with asyncio.timeout(limit):
                await self._acquire(due, priority)
                self._slot_taken(due, started, queued_at)
                if inline_ok and self._cheap():
                    return self._run_inline(fn, args)
                return await self._run_in_slot(fn, args, measure=inline_ok)
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

    def _slot_taken(self, due: float, started: float, queued_at: float | None) -> None:
        """Count a late start and smooth the wait for a slot: the load signal admission
        and credit read."""
        if time.monotonic() > due:
            self.late += 1
        waited = time.perf_counter() - min(started, queued_at or started)
        self.queue_wait += (waited - self.queue_wait) * WAIT_SMOOTHING

    def _cheap(self) -> bool:
        """Whether an inline-able call should run on the loop: measured, and cheaper than
        `inline_below_s` lately."""
        return self._costed >= MEASURED_BEFORE_INLINE and self.cost_s < self.inline_below_s

    def _note_cost(self, seconds: float) -> None:
        self._costed += 1
        self.cost_s += (seconds - self.cost_s) * COST_SMOOTHING

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

    def _run_inline(self, fn: Callable[..., T], args: tuple[object, ...]) -> T:
        """`fn(*args)` on the event loop, in a slot already taken (module docstring)."""
        self.running += 1
        self.inline_calls += 1
        started = time.perf_counter()
        try:
            return fn(*args)
        except VoxError:
            self.errors += 1
            raise
        except Exception as exc:  # not BaseException: a Ctrl-C on the loop stays one
            raise self._failure(exc) from exc
        finally:
            self._note_cost(time.perf_counter() - started)
            self._release_slot()

    async def _run_in_slot(
        self, fn: Callable[..., T], args: tuple[object, ...], *, measure: bool
    ) -> T:
        """`fn(*args)` on a worker thread, in a slot already taken. One hop back to the
        loop when the work is really over (done, failed or withdrawn before it started):
        it frees the slot, then hands over the result."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        spent = [-1.0]  # the call's CPU time, written by the worker

        def work() -> T:
            # CPU time, not wall time: a worker's wall time includes waiting for the GIL
            # the loop holds, which the same call run on the loop would not pay.
            began = time.thread_time()
            try:
                return fn(*args)
            finally:
                spent[0] = time.thread_time() - began

        def finish(done: Future[T]) -> None:  # on the loop's thread
            if measure and spent[0] >= 0:
                self._note_cost(spent[0])
            self._release_slot()
            if answer.done():
                return  # the caller was cancelled
            if done.cancelled():
                answer.cancel()
            elif (exc := done.exception()) is not None:
                answer.set_exception(_settable(exc))
            else:
                answer.set_result(done.result())

        def over(done: Future[T]) -> None:  # on the worker's thread (or the loop's)
            try:
                loop.call_soon_threadsafe(finish, done)
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                pass

        self.running += 1
        try:
            future = self._executor.submit(work)
        except BaseException:
            self._release_slot()
            raise
        future.add_done_callback(over)
        try:
            return await answer
        except asyncio.CancelledError:
            future.cancel()  # withdraws it if it has not started yet
            raise
        except VoxError:
            self.errors += 1
            raise
        except BaseException as exc:
            # Not only Exception: a SystemExit or other BaseException out of a model call (a
            # native library exiting, a torn-down worker) is this call's failure; let through,
            # asyncio would re-raise it out of the event loop and stop the server
            # (tests/faults).
            raise self._failure(exc) from exc

    def _failure(self, exc: BaseException) -> VoxError:
        """A failed engine call as the stage reports it: ValueError, which engines raise for
        bad requests (unknown voice, bad speed, ...), as INVALID_PARAMETER; anything else
        as ENGINE_ERROR."""
        self.errors += 1
        if isinstance(exc, ValueError):
            return VoxError(ErrorCode.INVALID_PARAMETER, str(exc), stage=self.name)
        return VoxError(
            ErrorCode.ENGINE_ERROR,
            f"{self.name} engine failed ({type(exc).__name__})",
            stage=self.name,
        )


def _settable(exc: BaseException) -> BaseException:
    """An asyncio future refuses StopIteration (and subclasses); carry it inside another."""
    if isinstance(exc, StopIteration):
        wrapped = RuntimeError(f"engine raised {type(exc).__name__}")
        wrapped.__cause__ = exc
        return wrapped
    return exc

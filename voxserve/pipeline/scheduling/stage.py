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

Work classes: a call is live (a session someone is talking to) or bulk (an upload's window,
a one-shot synthesis, prewarm: `priority=PRIORITY_BULK`). Bulk calls hold at most
`bulk_slots` slots at once (`pipeline.<stage>.bulk_slots`, default one less than the
limit), so however much bulk work is queued, the other slots stay free for live calls; a
bulk waiter whose turn comes while bulk holds its share is passed over (it keeps its place)
for the next live one. A work-conserving stage (`work_conserving=True`: TTS, whose bulk calls
are one clause each) lends bulk every slot while no live caller is queued: the reservation
holds only when live work actually waits, and then a live caller waits at most for one bulk
call to end (EDF ranks it among the bulk waiters). Bulk work is cut into calls of bounded
length (an upload's windows, pipeline/recognition/windows.py; a synthesis's chunks) that each queue
again, so bulk's slots come back to the queue at least that often, in deadline order. The
load signals flow control reads (`live_waiting`, `late`, `queue_wait`, `timeouts`) count
live calls only: bulk waiting its turn is by design, not pressure. Every call, of either
class and from any door, is reported to `on_call` when it ends (done, failed or timed
out): its stage, its work class, its whole time and its wait for a slot (the metrics).

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
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Protocol, TypeVar

from voxserve.errors import ErrorCode, VoxError

T = TypeVar("T")
CallObserver = Callable[[str, str, float, float], None]
"""on_call(stage, work class "live" or "bulk", seconds in all, seconds waiting for a slot)."""


@dataclass(frozen=True, slots=True)
class BulkOutlook:
    """A new bulk request's predicted wait: when it would be done (seconds from now), how
    many calls or items are before it (0: it would start at once), and how late it would
    make admitted work that is on time now (the most, in seconds)."""

    done_s: float
    ahead: int
    harms_s: float = 0.0


# The work class of a call (module docstring). Between equal deadlines live goes first;
# otherwise deadlines, not classes, decide the order, so nothing starves.
PRIORITY_LIVE = 0
PRIORITY_BULK = 10
BULK_COST_SMOOTHING = 0.3  # weight of the newest bulk call in the smoothed bulk call time
WAIT_SMOOTHING = 0.2  # weight of the newest call in the smoothed queue wait
COST_SMOOTHING = 0.2  # weight of the newest call in the smoothed cost of inline-able calls
MEASURED_BEFORE_INLINE = 3  # inline-able calls measured on the thread before any runs inline


def deadline_in(seconds: float) -> float:
    """An absolute stage deadline `seconds` from now (the clock EngineStage orders by)."""
    return time.monotonic() + seconds


_Waiter = tuple[float, int, int, "asyncio.Future[None]"]  # deadline, priority, seq, handoff


def default_bulk_slots(concurrency: int) -> int:
    """Slots bulk work may hold when the config does not say: all but one for live calls."""
    return max(1, concurrency - 1)


class LiveWork(Protocol):
    """What a stage reads of the batcher of its live work (pipeline/scheduling/batcher.py)."""

    def live_lateness(self) -> float: ...

    def busy_share(self) -> float: ...


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
        bulk_slots: int | None = None,
        work_conserving: bool = False,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"stage {name}: concurrency must be >= 1")
        bulk = default_bulk_slots(concurrency) if bulk_slots is None else bulk_slots
        if not 1 <= bulk <= concurrency:
            raise ValueError(f"stage {name}: bulk_slots must be within 1..{concurrency}")
        self.name = name
        self.concurrency = concurrency
        self.bulk_slots = bulk  # slots bulk calls may hold at once (module docstring)
        self.work_conserving = work_conserving  # bulk borrows every slot no live caller wants
        self.timeout_s = timeout_s
        self._executor = executor
        self.edf = edf  # False: first come, first served (deadlines still count `late`)
        self._free = concurrency  # slots nobody holds
        self._queue: list[_Waiter] = []  # live waiters' heap; withdrawn ones stay until popped
        self._bulk_queue: list[_Waiter] = []  # bulk waiters' heap, likewise
        self._seq = itertools.count()
        self._queued = 0  # callers queued for a slot, live and bulk
        self.bulk_waiting = 0  # bulk callers among them
        self.bulk_held = 0  # slots bulk calls hold (handed over or running)
        self.bulk_timeouts = 0
        self.bulk_call_s = 0.0  # smoothed time a bulk call holds its slot (bulk_outlook)
        self.refused_late = 0  # one-shot requests refused as predicted past their budget
        self._bulk_costed = False
        # Batches' worth of requests a batcher holds back while the engine is busy
        # (pipeline/scheduling/batcher.py): they wait as queued callers do, so they count in
        # `waiting`.
        self.held = 0
        self.running = 0
        self.calls = 0
        self.timeouts = 0  # live calls that timed out (flow pressure)
        self.late = 0  # live calls that got their slot after their deadline (flow pressure)
        self.queue_wait = 0.0  # seconds live callers wait for a slot, smoothed (flow pressure)
        self.errors = 0
        self.inline_below_s = inline_below_s  # 0: every call takes a worker thread
        self.inline_calls = 0  # calls run on the event loop (module docstring)
        self.cost_s = 0.0  # smoothed run time of inline-able calls, wherever they ran
        self._costed = 0  # inline-able calls measured so far
        self.on_call: CallObserver | None = None
        # The batcher that serves this stage's live work, where one predicts and measures
        # it (ASR finals: `watch_live`), held weakly: the stage outlives a reloaded engine,
        # whose batcher (and engine) must be free to go.
        self._live: weakref.ref[LiveWork] | None = None

    def watch_live(self, batcher: LiveWork) -> None:
        """The batcher of this stage's live work: how late what it holds would start
        (Batcher.live_lateness: flow control's pressure then) and the engine's recent busy
        share with it (what a live stream costs is learned from it: session_demand.py)."""
        self._live = weakref.ref(batcher)

    def predicted_late(self) -> float | None:
        """`watch_live`'s prediction; None where no live batcher predicts."""
        live = None if self._live is None else self._live()
        return None if live is None else live.live_lateness()

    def busy_share(self) -> float | None:
        """`watch_live`'s busy share; None where no live batcher measures it."""
        live = None if self._live is None else self._live()
        return None if live is None else live.busy_share()

    @property
    def waiting(self) -> int:
        """Callers queued for a slot plus requests held by a batcher (the stage queue length)."""
        return self._queued + self.held

    @property
    def live_waiting(self) -> int:
        """`waiting` less bulk callers: the queue flow control, partials and TTS health read."""
        return self.waiting - self.bulk_waiting

    @property
    def bulk_short(self) -> bool:
        """Bulk callers wait while bulk holds less than its share: live work took the
        slots. Best-effort live work (partials) stands aside then (turns/partials.py)."""
        return self.bulk_waiting > 0 and self.bulk_held < self.bulk_slots

    def slots_for(self, bulk: bool) -> int:
        """The slots a call of this class can count on while no live caller waits: what a
        prediction of its start spreads the work ahead over
        (pipeline/scheduling/tts_lateness.py)."""
        return self.concurrency if self.work_conserving or not bulk else self.bulk_slots

    def _bulk_limit(self, live_waits: bool) -> int:
        """Slots bulk may hold now: its share, or every slot on a work-conserving stage
        while no live caller waits (module docstring)."""
        return self.concurrency if self.work_conserving and not live_waits else self.bulk_slots

    def bulk_outlook(self, deadline: float, own_calls: int = 1) -> BulkOutlook:
        """When a new bulk request due at `deadline`, of `own_calls` calls, would be done,
        roughly: the bulk calls holding or queued ahead of it, then its own, over the bulk
        slots, each the smoothed bulk call time (0 before any). For refusing up front what
        could not finish within its budget (pipeline/recognition/bulk.py)."""
        ahead = self.bulk_held + sum(
            1 for due, _, _, handoff in self._bulk_queue if due <= deadline and not handoff.done()
        )
        done_s = ((ahead + max(1, own_calls) - 1) / self.bulk_slots + 1) * self.bulk_call_s
        return BulkOutlook(done_s, ahead)

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
        `inline_ok`: the engine allows its calls on the event loop (module docstring).
        `priority`: the work class, PRIORITY_LIVE or PRIORITY_BULK (module docstring)."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        started = time.perf_counter()
        due = time.monotonic() + limit if deadline is None else deadline
        bulk = priority >= PRIORITY_BULK
        self.calls += 1
        slot_at: float | None = None  # perf_counter when the call got its slot
        try:
            if inline_ok and self._cheap() and self._take_free(bulk):
                # A free slot and no thread: nothing to wait for, nothing to time out.
                slot_at = self._slot_taken(due, started, queued_at, bulk)
                return self._run_inline(fn, args, bulk)
            async with asyncio.timeout(limit):
                await self._acquire(due, priority)
                slot_at = self._slot_taken(due, started, queued_at, bulk)
                if inline_ok and self._cheap():
                    return self._run_inline(fn, args, bulk)
                return await self._run_in_slot(fn, args, measure=inline_ok, bulk=bulk)
        except TimeoutError:
            if bulk:
                self.bulk_timeouts += 1
            else:
                self.timeouts += 1
            raise VoxError(
                ErrorCode.STAGE_TIMEOUT,
                f"{self.name} did not answer within {limit:g} s",
                stage=self.name,
            ) from None
        finally:
            if self.on_call is not None:
                ended = time.perf_counter()
                # A call that never got a slot (timed out, cancelled) waited all along.
                waited = (slot_at or ended) - min(started, queued_at or started)
                self.on_call(self.name, "bulk" if bulk else "live", ended - started, waited)

    def _slot_taken(self, due: float, started: float, queued_at: float | None, bulk: bool) -> float:
        """Count a late start and smooth the wait for a slot: the load signal admission
        and credit read (live calls only: bulk waits its turn by design). Returns now."""
        now = time.perf_counter()
        if bulk:
            return now
        if time.monotonic() > due:
            self.late += 1
        waited = now - min(started, queued_at or started)
        self.queue_wait += (waited - self.queue_wait) * WAIT_SMOOTHING
        return now

    def _cheap(self) -> bool:
        """Whether an inline-able call should run on the loop: measured, and cheaper than
        `inline_below_s` lately."""
        return self._costed >= MEASURED_BEFORE_INLINE and self.cost_s < self.inline_below_s

    def _note_cost(self, seconds: float, bulk: bool) -> None:
        self._costed += 1
        self.cost_s += (seconds - self.cost_s) * COST_SMOOTHING
        if bulk:
            self._note_bulk(seconds)

    def _note_bulk(self, seconds: float) -> None:
        """Smooth how long a bulk call holds its slot (bulk_outlook); the first sets it."""
        weight = BULK_COST_SMOOTHING if self._bulk_costed else 1.0
        self._bulk_costed = True
        self.bulk_call_s += (seconds - self.bulk_call_s) * weight

    def _take_free(self, bulk: bool) -> bool:
        """Take a free slot at once if nobody it must not overtake is queued: for a live
        call, no live waiter (a free slot means none); for a bulk call, no waiter at all,
        and bulk under its share."""
        if self._free <= 0:
            return False
        if bulk:
            if self._queued or self.bulk_held >= self._bulk_limit(False):
                return False
            self.bulk_held += 1
        elif self._queued - self.bulk_waiting:
            return False
        self._free -= 1
        return True

    async def _acquire(self, deadline: float, priority: int) -> None:
        """Take a free slot, or queue until `_pass_slot` hands one over (earliest first)."""
        bulk = priority >= PRIORITY_BULK
        if self._take_free(bulk):
            return
        handoff: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        key = (deadline, priority) if self.edf else (0.0, 0)  # FIFO: the sequence decides
        heapq.heappush(self._bulk_queue if bulk else self._queue, (*key, next(self._seq), handoff))
        self._queued += 1
        self.bulk_waiting += bulk
        try:
            await handoff
        except asyncio.CancelledError:
            if handoff.done() and not handoff.cancelled():
                # Handed a slot and cancelled before using it: pass it on.
                self._release_slot(bulk, ran=False)
            else:
                handoff.cancel()  # withdrawn: skipped when popped
            raise
        finally:
            self._queued -= 1
            self.bulk_waiting -= bulk

    def _pass_slot(self) -> None:
        """A slot came free: give it to the earliest-deadline waiter (a bulk one only while
        bulk holds less than it may: `_bulk_limit`), else keep it."""
        live = _first_waiting(self._queue)
        limit = self._bulk_limit(live is not None)
        bulk = _first_waiting(self._bulk_queue) if self.bulk_held < limit else None
        if bulk is not None and (live is None or bulk[:3] < live[:3]):
            heapq.heappop(self._bulk_queue)[3].set_result(None)
            self.bulk_held += 1
        elif live is not None:
            heapq.heappop(self._queue)[3].set_result(None)
        else:
            self._free += 1

    def _release_slot(self, bulk: bool = False, *, ran: bool = True) -> None:
        """Give back a slot (`ran`: a call ran in it) and pass it on."""
        if ran:
            self.running -= 1
        if bulk:
            self.bulk_held -= 1
        self._pass_slot()

    def _run_inline(self, fn: Callable[..., T], args: tuple[object, ...], bulk: bool) -> T:
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
            self._note_cost(time.perf_counter() - started, bulk)
            self._release_slot(bulk)

    async def _run_in_slot(
        self, fn: Callable[..., T], args: tuple[object, ...], *, measure: bool, bulk: bool
    ) -> T:
        """`fn(*args)` on a worker thread, in a slot already taken. One hop back to the
        loop when the work is really over (done, failed or withdrawn before it started):
        it frees the slot, then hands over the result."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        spent = [-1.0]  # the call's CPU time, written by the worker
        held_from = time.perf_counter()

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
                self._note_cost(spent[0], bulk=False)
            if bulk:
                self._note_bulk(time.perf_counter() - held_from)
            self._release_slot(bulk)
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
            self._release_slot(bulk)
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


def _first_waiting(queue: list[_Waiter]) -> _Waiter | None:
    """The heap's earliest waiter still waiting; withdrawn ones on top are dropped."""
    while queue and queue[0][3].done():
        heapq.heappop(queue)
    return queue[0] if queue else None


def _settable(exc: BaseException) -> BaseException:
    """An asyncio future refuses StopIteration (and subclasses); carry it inside another."""
    if isinstance(exc, StopIteration):
        wrapped = RuntimeError(f"engine raised {type(exc).__name__}")
        wrapped.__cause__ = exc
        return wrapped
    return exc

"""Cross-session micro-batching: requests from every session, gathered briefly, run as one
engine call through the engine's stage.

Handing work to a thread costs more than many model calls (GIL hand-offs, context switches),
and batched models share per-call overhead and matrix products. Two ways a batch forms:

- *Held while busy*: at most `max_inflight` batches run at once (what the engine really runs
  in parallel, e.g. CTranslate2's replicas); requests arriving meanwhile wait here and go
  together when a batch ends. They would have waited for the engine anyway, so this costs
  no latency, and it is what makes finals of different sessions coincide under load.
- *A wait within the deadline's slack*: with the engine idle, requests are gathered for up
  to `max_wait_ms` (or until `max_batch`), never past the first request's deadline less a
  batch's usual run time, and only when the recent arrival rate says at least `min_company`
  more requests come in that time: a quiet server adds no latency, and a request that has
  already used its slack (held while the engine was busy) goes at once. Holding alone left
  Whisper's batches at one or two finals until it was nearly saturated (independent
  speakers' finals rarely coincide); a final's slack is where company can be waited for
  without missing what it was promised.

A batch's deadline on the stage is its earliest member's, so batching never demotes a
request; when more than `max_batch` are held, the earliest deadlines go first (arrival order
when the stage's EDF is off). Held requests count in the stage's `waiting` as the engine
calls they will take (ceil(held / max_batch)), as queued batches did before holding, so
partials, flow control and metrics see them queued.

Bulk requests (an upload's windows, `submit_bulk`) are a class of their own: they never
share a batch with live ones, their batches run as bulk calls on the stage (at most its
`bulk_slots` at once, so live batches always find a slot: pipeline/scheduling/stage.py), earliest
deadline first, requests of one kind (`bulk_key`) together, and a bulk batch holds at most
`bulk_cost` of work (an ASR batch: seconds of audio), so bulk gives its slot back to the
queue at least that often. Bulk waiting is by design: it is not counted as held.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.scheduling.batch_cost import BatchCost, Job, edf_finish, live_lateness
from voxserve.pipeline.scheduling.stage import PRIORITY_BULK, BulkOutlook, EngineStage

RETRY_ALONE = (ErrorCode.ENGINE_ERROR, ErrorCode.STAGE_TIMEOUT)
# An idle engine gathers bulk work in steps of this long while more is known to be coming
# (`_bulk_wait`), at most BULK_GATHER_MAX_S in all.
BULK_GATHER_S = 0.02
BULK_GATHER_MAX_S = 0.1
BUSY_TAU_S = 2.0  # the engine's busy share is smoothed over about this long
Req = TypeVar("Req")
Res = TypeVar("Res")


@dataclass(eq=False)
class BulkReservation:
    """Bulk work admitted and not yet handed over (an upload between its admission and its
    windows' submission, which may be a loop turn or a VAD pass later): counted ahead of
    later arrivals, so requests admitted in one loop turn do not all see an empty queue."""

    items: int
    cost: float
    deadline: float  # its promise (time.monotonic())


@dataclass(slots=True)
class _Item(Generic[Req, Res]):
    request: Req
    deadline: float | None
    future: asyncio.Future[Res]
    arrived: float = field(default_factory=time.perf_counter)
    cost: float = 0.0  # bulk: the work it brings (module docstring)
    expires: float | None = None  # bulk: when its caller stops waiting (time.monotonic())
    reservation: BulkReservation | None = None  # bulk: the admission it is one of


class Batcher(Generic[Req, Res]):
    def __init__(
        self,
        name: str,
        stage: EngineStage,
        run_many: Callable[[list[Req]], list[Res]],
        *,
        run_bulk: Callable[[list[Req]], list[Res]] | None = None,
        max_wait_ms: float,
        max_batch: int,
        max_inflight: int | None = None,
        min_company: float = 2.0,
        gather_when_busy: float = 0.0,
        inline_ok: bool = False,
    ) -> None:
        self.name = name
        self.stage = stage
        self.run_many = run_many  # blocking; one result per request, in order
        self.run_bulk = run_bulk or run_many  # the same, for a bulk batch
        self.inline_ok = inline_ok  # the engine allows cheap calls on the loop (stage.py)
        self.max_wait_s = max_wait_ms / 1000
        self.max_batch = max(1, max_batch)
        # Batches running at once; default: the stage's limit (never queue in the stage).
        self.max_inflight = max(1, max_inflight or stage.concurrency)
        self.min_company = min_company  # arrivals expected within a wait worth waiting for
        # Wait for company only while the engine's recent busy share is at least this: a
        # wait buys engine time, which only matters when the engine is nearly saturated.
        self.gather_when_busy = gather_when_busy
        self._busy = 0.0  # the engine's busy share, decaying over BUSY_TAU_S
        self._busy_at = time.perf_counter()
        self._pending: list[_Item[Req, Res]] = []
        self._held = 0  # what this batcher has added to stage.held
        self._timer: asyncio.Handle | None = None
        self._timer_at = 0.0  # loop time the timer fires at
        # Live batches running (owned here, awaited by their callers): when each began
        # (perf_counter) and its size, for live_lateness.
        self._running: dict[asyncio.Task[None], tuple[float, int]] = {}
        self._closed = False
        self._last_arrival = 0.0
        self._mean_gap_s = 1.0  # smoothed time between requests (all sessions)
        self._run_s = 0.0  # smoothed wall time of one batch at the engine
        self.live_cost_fit = BatchCost()  # a live batch's wall time by its size
        self.bulk_cost = math.inf  # work one bulk batch may hold (module docstring)
        self.max_bulk_batch = self.max_batch  # requests one bulk batch may hold
        # Bulk requests share a batch only when their keys are equal (what the engine runs
        # as one batch: for Whisper, the encoder window and the options).
        self.bulk_key: Callable[[Req], Hashable] = lambda _: None
        self._bulk_pending: list[_Item[Req, Res]] = []
        self._bulk_running: set[asyncio.Task[None]] = set()
        self._bulk_sizes: dict[asyncio.Task[None], int] = {}  # requests per running batch
        self._reserved: set[BulkReservation] = set()  # admitted, not yet submitted
        self._on_the_way = 0  # bulk requests still arriving (`expect_bulk`)
        self.bulk_cost_fit = BatchCost()  # a bulk batch's wall time by its size
        self._bulk_timer: asyncio.Handle | None = None
        self.batches = 0
        self.requests = 0
        self.bulk_batches = 0
        self.on_batch: Callable[[str, int], None] | None = None  # (engine, size): metrics

    @property
    def pending(self) -> int:
        """Requests gathered or held, not yet handed to the engine."""
        return len(self._pending)

    async def submit(self, request: Req, *, deadline: float | None = None) -> Res:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Res] = loop.create_future()
        self._pending.append(_Item(request, deadline, future))
        self._note_arrival(loop.time())
        if len(self._running) >= self.max_inflight:
            self._report_held()  # the engine is busy: held until a batch ends
        elif len(self._pending) >= self.max_batch:
            self._flush()
        else:
            self._gather(loop, self._gather_delay())
        return await future

    def reserve(self, items: int, cost: float, deadline: float) -> BulkReservation:
        """Hold `items` requests bringing `cost` of work, due at `deadline`, in the outlook
        until they are submitted (each `submit_bulk` naming it takes one off) or
        `release`d."""
        reservation = BulkReservation(items, cost, deadline)
        self._reserved.add(reservation)
        return reservation

    def expect_bulk(self, count: int) -> None:
        """`count` more (negative: fewer) bulk requests on their way: a one-shot recording
        still being sent, not yet admitted. An idle engine gathers for them (`_bulk_wait`),
        so the first of a burst does not go to Whisper alone."""
        self._on_the_way = max(0, self._on_the_way + count)

    def release(self, reservation: BulkReservation) -> None:
        self._reserved.discard(reservation)

    async def submit_bulk(
        self,
        request: Req,
        *,
        deadline: float,
        expires: float,
        cost: float = 0.0,
        reservation: BulkReservation | None = None,
    ) -> Res:
        """A bulk request (module docstring), due at `deadline` for the stage's EDF order,
        abandoned by its caller at `expires` (both time.monotonic()); one of `reservation`'s
        requests, if given."""
        if reservation is not None:
            reservation.items = max(0, reservation.items - 1)
            reservation.cost = max(0.0, reservation.cost - cost)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Res] = loop.create_future()
        self._bulk_pending.append(
            _Item(request, deadline, future, cost=cost, expires=expires, reservation=reservation)
        )
        if self._bulk_timer is None and len(self._bulk_running) < self._bulk_inflight():
            if self._bulk_wait({reservation}):
                self._bulk_timer = loop.call_later(
                    BULK_GATHER_S, self._gathered_bulk, loop.time() + BULK_GATHER_MAX_S
                )
            else:  # after this loop turn: windows submitted together still share a batch
                self._bulk_timer = loop.call_soon(self._flush_bulk)
        return await future

    def _gathered_bulk(self, until: float) -> None:
        """A gathering step is over: go on while more is still coming, until `until`."""
        loop = asyncio.get_running_loop()
        gathered = {item.reservation for item in self._bulk_pending}
        if self._bulk_wait(gathered) and loop.time() + BULK_GATHER_S <= until:
            self._bulk_timer = loop.call_later(BULK_GATHER_S, self._gathered_bulk, until)
            return
        self._flush_bulk()

    def _bulk_wait(self, own: set[BulkReservation | None]) -> bool:
        """Whether an idle engine should gather bulk work for BULK_GATHER_S: only while
        more is known to be coming, another request (not one of `own`, those gathered: an
        upload's later windows may be a VAD pass away) admitted and not yet handed over its
        windows, or one still arriving (`expect_bulk`: a burst of one-shot recordings).
        Else the wait was pure delay: a lone one-shot Wyoming transcript waited 20 ms of
        its ~130 ms for company that never came."""
        if self._on_the_way:
            return True
        return any(r.items for r in self._reserved if r not in own)

    @property
    def bulk_on_the_way(self) -> int:
        """Bulk requests said to be on their way (`expect_bulk`), not yet here."""
        return self._on_the_way

    def bulk_outlook(
        self, deadline: float, own_items: int = 1, own_cost: float = 0.0
    ) -> BulkOutlook:
        """What admitting a new bulk request due at `deadline` (its promise), of
        `own_items` requests (an upload's windows) bringing `own_cost` of work, would do:
        when it would be done, and how late it would make work admitted before it that is
        on time now (EDF: a request due sooner overtakes it). Simulated as the batcher
        serves bulk (batch_cost.edf_finish): the batches running first (counted whole:
        the estimate errs late), then every request pending or admitted and not yet
        submitted (`reserve`) and its own, in deadline order, in batches each at the fitted
        cost of its size (`bulk_cost_fit`; before any bulk batch, a live batch's time per
        request: 0 before either, and nothing is refused). For refusing up front what
        could not finish within its promise (pipeline/recognition/bulk.py)."""
        now = time.monotonic()
        jobs = [
            Job((item.deadline or now) - now, 1, item.cost)
            for item in self._bulk_pending
            if not item.future.done()
        ]
        jobs += [Job(r.deadline - now, r.items, r.cost) for r in self._reserved if r.items]
        own = Job(deadline - now, max(1, own_items), own_cost)
        fit = self.bulk_cost_fit
        if not fit.batches:  # a live batch's time per request, until bulk is measured
            fit = BatchCost()
            fit.observe(1, self._run_s)
        slots = self._bulk_inflight()
        start = sum(fit.batch_seconds(size) for size in self._bulk_sizes.values()) / slots

        def finish(batch: list[Job]) -> list[float]:
            return edf_finish(
                batch,
                fit,
                max_batch=self.max_bulk_batch,
                max_cost=self.bulk_cost,
                slots=slots,
                start_s=start,
            )

        before, after = finish(jobs), finish([*jobs, own])
        harms = max(
            (
                late - job.deadline_s
                for job, on_time, late in zip(jobs, before, after, strict=False)
                if on_time <= job.deadline_s < late
            ),
            default=0.0,
        )
        running = sum(self._bulk_sizes.values())
        ahead = running + sum(job.items for job in jobs if job.deadline_s <= own.deadline_s)
        return BulkOutlook(after[-1], ahead, harms)

    def _bulk_inflight(self) -> int:
        """Bulk batches run at once: what the stage lets bulk hold, within the engine's."""
        return max(1, min(self.stage.bulk_slots, self.max_inflight))

    def _flush_bulk(self) -> None:
        """Start bulk batches, earliest deadlines first, while bulk has room."""
        if self._bulk_timer is not None:
            self._bulk_timer.cancel()
            self._bulk_timer = None
        pending = [item for item in self._bulk_pending if not item.future.done()]
        pending.sort(key=lambda i: math.inf if i.deadline is None else i.deadline)
        while pending and len(self._bulk_running) < self._bulk_inflight():
            # The earliest-due request and those after it that the engine runs as one batch
            # (same `bulk_key`): a short upload's window behind long ones goes in a batch
            # of its own kind, not held until unlike windows are done.
            key = self.bulk_key(pending[0].request)
            batch: list[_Item[Req, Res]] = []
            rest: list[_Item[Req, Res]] = []
            cost = 0.0
            for item in pending:
                full = len(batch) >= self.max_bulk_batch or (
                    batch and cost + item.cost > self.bulk_cost
                )
                if full or self.bulk_key(item.request) != key:
                    rest.append(item)
                    continue
                cost += item.cost
                batch.append(item)
            pending = rest
            task = asyncio.get_running_loop().create_task(self._run(batch, bulk=True))
            self._bulk_running.add(task)
            self._bulk_sizes[task] = len(batch)
            task.add_done_callback(self._bulk_batch_done)
        self._bulk_pending = pending

    def _bulk_batch_done(self, task: asyncio.Task[None]) -> None:
        self._bulk_running.discard(task)
        self._bulk_sizes.pop(task, None)
        if self._bulk_pending and not self._closed:
            self._flush_bulk()

    def _gather(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        """(Re)arm the flush timer: a request due sooner than the timer shortens the wait."""
        at = loop.time() + delay
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        # uvloop answers a call that is due now with a Handle that has no when(): keep `at`.
        self._timer_at = at
        self._timer = loop.call_at(at, self._flush)

    def _gather_delay(self) -> float:
        """How long an idle engine waits for company: within max_wait and the earliest
        pending deadline's slack, and only if `min_company` arrivals are expected by then."""
        if self.gather_when_busy > 0 and self.busy_share() < self.gather_when_busy:
            return 0.0
        wait = self.max_wait_s
        deadlines = [item.deadline for item in self._pending if item.deadline is not None]
        if deadlines:  # deadlines are time.monotonic() (stage.deadline_in)
            wait = min(wait, min(deadlines) - time.monotonic() - self._run_s)
        return wait if wait > 0 and self._company_within(wait) else 0.0

    def _company_within(self, wait: float) -> bool:
        """Whether the arrival rate says `min_company` more requests come within `wait`."""
        return wait >= self.min_company * max(self._mean_gap_s, 1e-6)

    def busy_share(self) -> float:
        """Share of the recent past (~BUSY_TAU_S) the engine spent running this batcher's
        batches (1.0: max_inflight batches all the time)."""
        self._track_busy()
        return self._busy

    def _track_busy(self) -> None:
        """Decay the busy share up to now under the current running count; called before
        that count changes."""
        now = time.perf_counter()
        keep = math.exp(-(now - self._busy_at) / BUSY_TAU_S)
        share = len(self._running) / self.max_inflight
        self._busy = self._busy * keep + share * (1.0 - keep)
        self._busy_at = now

    def _note_arrival(self, now: float) -> None:
        """Smooth the time between requests: whether company is coming within max_wait."""
        self._mean_gap_s += 0.1 * (min(now - self._last_arrival, 1.0) - self._mean_gap_s)
        self._last_arrival = now

    def _flush(self) -> None:
        """Start batches while the engine has room; whatever is left stays held."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending = [item for item in self._pending if not item.future.done()]
        if self.stage.edf and len(self._pending) > self.max_batch:
            self._pending.sort(key=lambda i: math.inf if i.deadline is None else i.deadline)
        while self._pending and len(self._running) < self.max_inflight:
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._track_busy()
            self._running[task] = (time.perf_counter(), len(batch))
            task.add_done_callback(self._batch_done)
        self._report_held()

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._track_busy()
        self._running.pop(task, None)
        if self._pending and self._timer is None and not self._closed:
            delay = self._gather_delay() if len(self._pending) < self.max_batch else 0.0
            if delay > 0:
                self._report_held()  # gathering now, no longer held
                self._gather(asyncio.get_running_loop(), delay)
                return
            self._flush()
        else:
            self._report_held()

    def _report_held(self) -> None:
        busy = len(self._running) >= self.max_inflight
        held = -(-len(self._pending) // self.max_batch) if busy else 0  # engine calls' worth
        self.stage.held += held - self._held
        self._held = held

    async def _run(self, batch: list[_Item[Req, Res]], *, bulk: bool = False) -> None:
        try:
            if bulk:
                results = await self._call_bulk(batch)
            else:
                results = await self._call(
                    [item.request for item in batch],
                    [item.deadline for item in batch],
                    [item.arrived for item in batch],
                )
        except BaseException as exc:
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for item, result in zip(batch, results, strict=True):
            if item.future.done():
                continue
            if isinstance(result, BaseException):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)

    async def _call(
        self,
        requests: list[Req],
        deadlines: list[float | None],
        arrivals: list[float | None],
    ) -> list[Res | BaseException]:
        """One engine call for `requests` (counted as a batch), each one's result or failure
        in its place. A failure that may be one request's (RETRY_ALONE) must not fail, or
        time out, the others batched with it: each runs again on its own, and only the
        culprit fails (tests/faults). A batch's deadline is its earliest member's."""
        self.batches += 1
        self.requests += len(requests)
        if self.on_batch is not None:
            self.on_batch(self.name, len(requests))
        due = [d for d in deadlines if d is not None]
        waiting = [a for a in arrivals if a is not None]
        started = time.perf_counter()
        try:
            results: list[Res | BaseException] = list(
                await self.stage.run(
                    self.run_many,
                    requests,
                    deadline=min(due) if due else None,
                    queued_at=min(waiting) if waiting else None,
                    inline_ok=self.inline_ok,
                )
            )
        except VoxError as exc:
            if len(requests) > 1 and exc.code in RETRY_ALONE:
                alone = await asyncio.gather(
                    *(
                        self._call([r], [d], [a])
                        for r, d, a in zip(requests, deadlines, arrivals, strict=True)
                    ),
                    return_exceptions=True,
                )
                return [one if isinstance(one, BaseException) else one[0] for one in alone]
            return [exc] * len(requests)
        took = time.perf_counter() - started
        self._run_s += 0.2 * (took - self._run_s)
        self.live_cost_fit.observe(len(requests), took)
        return results

    def live_lateness(self) -> float:
        """How late the held live request that fares worst would start, in seconds past its
        deadline (0: all on time): the requests gathered or held,
        in deadline order (none: the stage timeout from now), in batches at the fitted
        cost of their size (`live_cost_fit`), each on the first of the engine's
        `max_inflight` slots to come free; a running batch frees its slot when its fitted
        cost has passed (now, if it overran). Before any batch is measured every cost is
        0: only a final already past its deadline while held counts (the first batch of a
        burst can run for seconds before it is measured). The flow monitor's pressure for
        this stage (pipeline/scheduling/flow.py): whether the finals waiting now can be
        served in time, not how many they are."""
        fit = self.live_cost_fit
        now, clock = time.monotonic(), time.perf_counter()
        free_at = [
            max(0.0, fit.batch_seconds(size) - (clock - began))
            for began, size in self._running.values()
        ]
        free_at += [0.0] * max(0, self.max_inflight - len(free_at))
        fallback = self.stage.timeout_s
        deadlines = [
            fallback if item.deadline is None else item.deadline - now
            for item in self._pending
            if not item.future.done()
        ]
        return live_lateness(deadlines, fit, max_batch=self.max_batch, free_at_s=free_at)

    async def _call_bulk(self, batch: list[_Item[Req, Res]]) -> list[Res | BaseException]:
        """One bulk engine call (counted as a batch): a bulk call on the stage, due at its
        earliest member's deadline, given until its last member's caller stops waiting. A
        failure is every member's (an upload's window is not retried alone: its caller
        answers the error)."""
        self.batches += 1
        self.bulk_batches += 1
        self.requests += len(batch)
        if self.on_batch is not None:
            self.on_batch(self.name, len(batch))
        now = time.monotonic()
        due = [item.deadline for item in batch if item.deadline is not None]
        expiries = [item.expires for item in batch if item.expires is not None]
        try:
            results: list[Res | BaseException] = list(
                await self.stage.run(
                    self.run_bulk,
                    [item.request for item in batch],
                    deadline=min(due) if due else None,
                    timeout_s=max(expiries) - now if expiries else None,
                    priority=PRIORITY_BULK,
                )
            )
        except VoxError as exc:
            return [exc] * len(batch)
        # Its wait for a slot included: live work taking the slots slows bulk as much.
        self.bulk_cost_fit.observe(len(batch), time.monotonic() - now)
        return results

    def close(self) -> None:
        """Cancel running batches and anything still gathered or held (their callers see
        CancelledError); the stage's held count is given back."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._bulk_timer is not None:
            self._bulk_timer.cancel()
            self._bulk_timer = None
        for task in (*self._running, *self._bulk_running):
            task.cancel()
        for item in (*self._pending, *self._bulk_pending):
            item.future.cancel()
        self._pending = []
        self._bulk_pending = []
        self.stage.held -= self._held
        self._held = 0

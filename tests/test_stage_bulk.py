"""Bulk work on an engine stage (pipeline/scheduling/stage.py): it holds at most `bulk_slots` slots,
and live calls find the rest; a live call arriving while bulk calls queue runs first.

An executor the test steps by hand (`SteppedExecutor`) makes every schedule exact: a call
"runs" from the moment the stage submits it until the test finishes it. Generated schedules
(arrivals of both classes with any deadlines, finishes, withdrawals) check the rule as a
property; two named schedules show it plainly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voxserve.config import FlowConfig, StageConfig
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.scheduling.flow import FlowMonitor
from voxserve.pipeline.scheduling.stage import (
    MEASURED_BEFORE_INLINE,
    PRIORITY_BULK,
    PRIORITY_LIVE,
    EngineStage,
    deadline_in,
)


@dataclass
class Call:
    name: str
    bulk: bool
    deadline: float
    task: asyncio.Task[Any]
    started: int = -1  # step at which the stage submitted it (-1: not yet)


class SteppedExecutor(Executor):
    """Runs nothing until told: `finish` completes a submitted call. Records which task
    (which caller) each submission came from."""

    def __init__(self) -> None:
        self.jobs: list[tuple[asyncio.Task[Any] | None, Callable[[], object], Future[Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.jobs.append((asyncio.current_task(), lambda: fn(*args, **kwargs), future))
        return future

    def running(self) -> list[asyncio.Task[Any] | None]:
        return [task for task, _, future in self.jobs if not future.done()]

    def finish(self, task: asyncio.Task[Any] | None) -> None:
        for index, (owner, fn, future) in enumerate(self.jobs):
            if owner is task:
                del self.jobs[index]
                if future.set_running_or_notify_cancel():
                    future.set_result(fn())
                return
        raise AssertionError("no such job")


async def _settle() -> None:
    for _ in range(6):
        await asyncio.sleep(0)


class Harness:
    def __init__(
        self, concurrency: int, bulk_slots: int | None, work_conserving: bool = False
    ) -> None:
        self.executor = SteppedExecutor()
        self.stage = EngineStage(
            "asr",
            concurrency,
            30.0,
            self.executor,
            bulk_slots=bulk_slots,
            work_conserving=work_conserving,
        )
        self.calls: list[Call] = []
        self.step = 0

    def arrive(self, bulk: bool, due_in: float) -> Call:
        deadline = time.monotonic() + due_in
        priority = PRIORITY_BULK if bulk else PRIORITY_LIVE
        name = f"{'bulk' if bulk else 'live'}{len(self.calls)}"
        task = asyncio.ensure_future(
            self.stage.run(lambda: name, deadline=deadline, priority=priority)
        )
        call = Call(name, bulk, deadline, task)
        self.calls.append(call)
        return call

    async def settle(self) -> None:
        await _settle()
        self.step += 1
        running = set(self.executor.running())
        for call in self.calls:
            if call.started < 0 and call.task in running:
                call.started = self.step
        self.check()

    def waiting(self) -> list[Call]:
        return [c for c in self.calls if c.started < 0 and not c.task.done()]

    def running(self) -> list[Call]:
        running = set(self.executor.running())
        return [c for c in self.calls if c.task in running]

    def check(self) -> None:
        """The rule, after every step."""
        stage = self.stage
        running = self.running()
        bulk_running = sum(c.bulk for c in running)
        assert len(running) == stage.running <= stage.concurrency
        waiting = self.waiting()
        live_waits = any(not c.bulk for c in waiting)
        if not stage.work_conserving:
            assert bulk_running <= stage.bulk_slots
        free = stage.concurrency - len(running)
        if live_waits:
            assert free == 0, "a live call waits beside a free slot"
        if any(c.bulk for c in waiting):
            # Work-conserving: bulk borrows any free slot (none is free while live waits).
            full = stage.work_conserving or bulk_running == stage.bulk_slots
            assert free == 0 or full, "bulk waits for nothing"
        for started in (c for c in running if c.started == self.step):
            for other in waiting:
                if other.bulk == started.bulk:
                    assert started.deadline <= other.deadline, "not earliest-deadline-first"
                elif started.bulk:
                    assert started.deadline <= other.deadline, "bulk went before due live work"

    async def finish(self, call: Call) -> None:
        self.executor.finish(call.task)
        await self.settle()

    async def drain(self) -> None:
        while running := self.running():
            await self.finish(running[0])
        await asyncio.gather(*(c.task for c in self.calls), return_exceptions=True)
        assert self.stage.running == 0 and self.stage.bulk_held == 0
        assert self.stage.waiting == 0 and self.stage.bulk_waiting == 0


async def test_bulk_holds_its_share_and_a_live_arrival_runs_first() -> None:
    """Two slots, bulk's share one: five upload windows queue, one runs. A live final
    arriving behind them starts at once in the other slot; with both slots busy, the next
    free slot goes to a live call due before the queued windows, not to a window."""
    h = Harness(concurrency=2, bulk_slots=None)
    assert h.stage.bulk_slots == 1
    windows = [h.arrive(True, 15.0 + 14.0 * k) for k in range(5)]
    await h.settle()
    assert [c.started > 0 for c in windows] == [True, False, False, False, False]
    final = h.arrive(False, 0.5)
    await h.settle()
    assert final.started == h.step and h.stage.running == 2  # no wait for any window
    partial = h.arrive(False, 1.5)
    await h.settle()
    await h.finish(windows[0])  # the window's slot: to the live partial, due first
    assert partial.started == h.step and windows[1].started < 0
    await h.finish(final)  # a live slot: bulk is under its share again, the next window
    assert windows[1].started == h.step
    await h.drain()


async def test_overdue_bulk_goes_first_but_never_past_its_share() -> None:
    """Deadlines decide across classes (an overdue window is not starved), but however
    overdue, bulk never takes the slot live calls need."""
    h = Harness(concurrency=3, bulk_slots=2)
    windows = [h.arrive(True, -1.0) for _ in range(4)]  # overdue: before any live call
    await h.settle()
    assert sum(c.started > 0 for c in windows) == 2
    live = [h.arrive(False, 0.5) for _ in range(2)]
    await h.settle()
    assert live[0].started == h.step and live[1].started < 0  # the third slot, at once
    await h.finish(windows[0])  # overdue window first (EDF), bulk still within its share
    assert windows[2].started == h.step and live[1].started < 0
    await h.finish(live[0])  # a live slot frees: bulk is at its share, so the live call
    assert live[1].started == h.step and windows[3].started < 0
    await h.drain()


async def test_a_work_conserving_stage_lends_bulk_every_slot_until_live_work_waits() -> None:
    """TTS (one-shot syntheses are bulk): with no live reply queued, bulk takes both
    slots; a live reply arriving then waits for one bulk call only: while live work waits,
    bulk is back to its share (EDF within it), and when none waits bulk borrows again."""
    h = Harness(concurrency=2, bulk_slots=None, work_conserving=True)
    assert h.stage.slots_for(True) == 2 and h.stage.bulk_slots == 1
    clauses = [h.arrive(True, 0.2 + 0.01 * k) for k in range(4)]
    await h.settle()
    assert [c.started > 0 for c in clauses] == [True, True, False, False]  # both slots
    replies = [h.arrive(False, 0.5), h.arrive(False, 0.6)]
    await h.settle()
    assert all(r.started < 0 for r in replies)  # no free slot: it waits for one clause
    await h.finish(clauses[0])  # bulk holds one slot, its share, and live work waits
    assert replies[0].started == h.step and clauses[2].started < 0
    await h.finish(clauses[1])  # bulk under its share: EDF, the clause is due first
    assert clauses[2].started == h.step and replies[1].started < 0
    await h.finish(clauses[2])  # likewise
    assert clauses[3].started == h.step and replies[1].started < 0
    await h.finish(clauses[3])  # no clause waits: the reply
    assert replies[1].started == h.step
    await h.finish(replies[0])
    more = [h.arrive(True, 0.3), h.arrive(True, 0.3)]
    await h.settle()
    assert more[0].started == h.step and more[1].started < 0
    await h.finish(replies[1])  # no live work waits: bulk borrows the slot again
    assert more[1].started == h.step and h.stage.bulk_held == 2
    await h.drain()
    plain = EngineStage("asr", 2, 1.0, SteppedExecutor())
    assert plain.slots_for(True) == 1 and plain.slots_for(False) == 2


async def test_inline_calls_respect_the_share_too() -> None:
    """A bulk call that could run on the loop still counts against bulk's share."""
    executor = SteppedExecutor()
    stage = EngineStage("asr", 2, 30.0, executor, bulk_slots=1, inline_below_s=1.0)
    for _ in range(MEASURED_BEFORE_INLINE):  # measured cheap: inline from now on
        task = asyncio.ensure_future(stage.run(lambda: 0, inline_ok=True))
        await _settle()
        executor.finish(task)
        await task
    hold = asyncio.ensure_future(stage.run(lambda: 0, priority=PRIORITY_BULK))
    await _settle()
    assert stage.bulk_held == 1
    blocked = asyncio.ensure_future(stage.run(lambda: 1, priority=PRIORITY_BULK, inline_ok=True))
    await _settle()
    assert not blocked.done() and stage.bulk_waiting == 1  # not inline past the share
    assert await stage.run(lambda: 2, inline_ok=True) == 2  # a live one is, at once
    executor.finish(hold)
    await _settle()
    assert await blocked == 1 and stage.bulk_held == 0


async def test_bulk_signals_are_not_live_pressure() -> None:
    """Queued bulk work is in `waiting` (the queue length) but not `live_waiting`, and a
    bulk timeout is not a live one: flow control and partials read the live figures."""
    h = Harness(concurrency=2, bulk_slots=1)
    h.arrive(True, 15.0)
    await h.settle()
    short = asyncio.ensure_future(h.stage.run(lambda: 0, priority=PRIORITY_BULK, timeout_s=0.01))
    h.arrive(True, 29.0)
    await h.settle()
    assert (h.stage.waiting, h.stage.live_waiting, h.stage.bulk_waiting) == (2, 0, 2)
    assert h.stage.bulk_short is False  # bulk holds its share
    with pytest.raises(VoxError) as err:
        await short
    assert err.value.code is ErrorCode.STAGE_TIMEOUT
    assert (h.stage.timeouts, h.stage.bulk_timeouts, h.stage.late) == (0, 1, 0)
    await h.drain()


@pytest.mark.parametrize("bulk", [True, False])
async def test_queued_bulk_is_no_pressure_for_flow_control(bulk: bool) -> None:
    """Bulk windows queued for seconds do not shrink credit windows or shed sessions; the
    same queue of live calls does (pipeline/scheduling/flow.py reads the live figures)."""
    h = Harness(concurrency=1, bulk_slots=1)
    now = [0.0]
    cfg = FlowConfig(queue_limit=1, shed_after_s=0.5)
    monitor = FlowMonitor(cfg, {"asr": h.stage}, clock=lambda: now[0])
    for k in range(4):
        h.arrive(bulk, 15.0 + k)
    await h.settle()
    for _ in range(10):
        monitor.tick()
        now[0] += 0.2
    assert (monitor.overloaded() == "asr") is not bulk
    await h.drain()


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("live"), st.floats(-2.0, 20.0)),
        st.tuples(st.just("bulk"), st.floats(-2.0, 60.0)),
        st.tuples(st.just("finish"), st.integers(0, 7)),
        st.tuples(st.just("cancel"), st.integers(0, 15)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(concurrency=st.integers(1, 4), share=st.integers(0, 4), conserving=st.booleans(), ops=OPS)
def test_generated_schedules_keep_the_rule(
    concurrency: int, share: int, conserving: bool, ops: list[tuple[str, float]]
) -> None:
    """Any mix of arrivals, finishes and withdrawals: after every step bulk holds at most
    its share (unless the stage is work-conserving), no live call waits beside a free slot,
    no bulk call waits for nothing, each class is admitted earliest-deadline-first, and
    bulk never goes before live work due sooner (Harness.check); at the end every slot is
    back."""
    bulk_slots = min(concurrency, share) or None

    async def play() -> None:
        h = Harness(concurrency, bulk_slots, conserving)
        for kind, value in ops:
            if kind in ("live", "bulk"):
                h.arrive(kind == "bulk", value)
            elif kind == "finish" and (running := h.running()):
                h.executor.finish(running[int(value) % len(running)].task)
            elif kind == "cancel" and (waiting := h.waiting()):
                waiting[int(value) % len(waiting)].task.cancel()
            await h.settle()
        await h.drain()

    asyncio.run(play())


def test_bulk_slots_config_is_checked() -> None:
    assert StageConfig(concurrency=4, timeout_s=1.0).bulk_slots is None
    with pytest.raises(ValueError, match="bulk_slots must be at most concurrency"):
        StageConfig(concurrency=2, timeout_s=1.0, bulk_slots=3)
    with pytest.raises(ValueError, match="bulk_slots must be within"):
        EngineStage("asr", 2, 1.0, SteppedExecutor(), bulk_slots=0)
    assert EngineStage("asr", 1, 1.0, SteppedExecutor()).bulk_slots == 1
    assert EngineStage("asr", 4, 1.0, SteppedExecutor()).bulk_slots == 3
    assert deadline_in(0) <= time.monotonic()


async def test_every_call_reports_its_class_time_and_wait_for_a_slot() -> None:
    """on_call (the metrics) hears of each call: a bulk call that ran at once waited about
    nothing, a live one queued behind it waited until it was done, and a call that timed
    out queueing waited all of its time."""
    executor = SteppedExecutor()
    stage = EngineStage("tts", 1, 10.0, executor)
    heard: list[tuple[str, str, float, float]] = []
    stage.on_call = lambda *call: heard.append(call)
    first = asyncio.create_task(stage.run(lambda: 1, priority=PRIORITY_BULK))
    await asyncio.sleep(0)
    second = asyncio.create_task(stage.run(lambda: 2))
    late = asyncio.create_task(stage.run(lambda: 3, timeout_s=0.05))
    await asyncio.sleep(0.1)
    executor.finish(first_task(executor))
    assert await first == 1
    await asyncio.sleep(0)
    executor.finish(first_task(executor))
    assert await second == 2
    with pytest.raises(VoxError):
        await late
    by_result = {round(wait, 1): (name, work_class) for name, work_class, _, wait in heard}
    assert len(heard) == 3 and all(name == "tts" for name, *_ in heard)
    (bulk,) = [c for c in heard if c[1] == "bulk"]
    assert bulk[3] < 0.01  # a free slot: no wait
    live = sorted(c[3] for c in heard if c[1] == "live")
    assert 0.05 <= live[0] < 0.5 and 0.09 <= live[1] < 0.5, (live, by_result)
    assert all(total >= wait for _, _, total, wait in heard)


def first_task(executor: SteppedExecutor) -> asyncio.Task[Any] | None:
    return executor.running()[0]

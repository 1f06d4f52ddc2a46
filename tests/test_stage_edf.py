"""EngineStage admits waiting callers earliest-deadline-first (fake engines, scripted cost)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers import PeakConcurrency
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.scheduling.stage import PRIORITY_BULK, EngineStage, deadline_in


async def _occupy(stage: EngineStage, gate: threading.Event) -> asyncio.Task[bool]:
    """Fill every slot with work that lasts until `gate` is set."""
    tasks = [asyncio.ensure_future(stage.run(gate.wait, 5.0)) for _ in range(stage.concurrency)]
    while stage.running < stage.concurrency:  # noqa: ASYNC110 (a test poll)
        await asyncio.sleep(0.001)
    return tasks[0]


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(8)
    yield pool
    pool.shutdown()


async def _held(
    kind: str, executor: ThreadPoolExecutor
) -> tuple[EngineStage, threading.Event, asyncio.Task[bool]]:
    """A stage of one slot, held by work that lasts until `gate` is set: the stage, the
    gate and that work."""
    stage = EngineStage(kind, concurrency=1, timeout_s=5.0, executor=executor)
    gate = threading.Event()
    return stage, gate, await _occupy(stage, gate)


async def test_waiters_are_admitted_earliest_deadline_first(executor: ThreadPoolExecutor) -> None:
    stage, gate, blocker = await _held("asr", executor)
    order: list[str] = []

    def work(name: str) -> None:
        order.append(name)
        time.sleep(0.002)  # scripted cost

    calls = [
        stage.run(work, "partial", deadline=deadline_in(2.0)),
        stage.run(work, "prewarm", deadline=deadline_in(4.0), priority=PRIORITY_BULK),
        stage.run(work, "final", deadline=deadline_in(0.5)),
        stage.run(work, "default"),  # now + 5 s
        stage.run(work, "first-chunk", deadline=deadline_in(0.2)),
    ]
    waiting = [asyncio.ensure_future(c) for c in calls]
    await asyncio.sleep(0.01)
    assert stage.waiting == 5
    gate.set()
    await asyncio.gather(blocker, *waiting)
    assert order == ["first-chunk", "final", "partial", "prewarm", "default"]
    assert stage.waiting == 0 and stage.running == 0


async def test_equal_deadlines_break_ties_by_priority_then_arrival(
    executor: ThreadPoolExecutor,
) -> None:
    stage, gate, blocker = await _held("tts", executor)
    order: list[str] = []
    due = deadline_in(1.0)
    names = [("bulk", PRIORITY_BULK), ("a", 0), ("b", 0)]
    waiting = [
        asyncio.ensure_future(stage.run(order.append, n, deadline=due, priority=p))
        for n, p in names
    ]
    await asyncio.sleep(0.01)
    gate.set()
    await asyncio.gather(blocker, *waiting)
    assert order == ["a", "b", "bulk"]


async def test_no_starvation_a_queued_deadline_eventually_comes_first(
    executor: ThreadPoolExecutor,
) -> None:
    """A loose-deadline item waits while tighter work keeps arriving, but every arrival's
    deadline is later than now, so once the old deadline is the earliest it runs."""
    stage = EngineStage("asr", concurrency=1, timeout_s=5.0, executor=executor)
    order: list[str] = []

    def work(name: str) -> None:
        order.append(name)
        time.sleep(0.01)

    loose = asyncio.ensure_future(stage.run(work, "loose", deadline=deadline_in(0.1)))
    stream: list[asyncio.Future[None]] = []
    for i in range(40):  # a steady flood of work due 50 ms after it arrives
        stream.append(asyncio.ensure_future(stage.run(work, f"t{i}", deadline=deadline_in(0.05))))
        await asyncio.sleep(0.005)
    await asyncio.gather(loose, *stream)
    assert order.index("loose") < 20  # ran long before the flood ended


async def test_concurrency_bound_holds_under_edf(executor: ThreadPoolExecutor) -> None:
    stage = EngineStage("asr", concurrency=3, timeout_s=5.0, executor=executor)
    work = PeakConcurrency(0.005)
    await asyncio.gather(
        *(stage.run(work, deadline=deadline_in((i * 7919 % 13) / 10)) for i in range(40))
    )
    assert work.peak == 3 and stage.running == 0 and stage.waiting == 0


async def test_withdrawn_waiters_never_run_and_free_their_place(
    executor: ThreadPoolExecutor,
) -> None:
    stage, gate, blocker = await _held("tts", executor)
    ran: list[str] = []
    cancelled = asyncio.ensure_future(stage.run(ran.append, "cancelled", deadline=deadline_in(0)))
    timed_out = asyncio.ensure_future(
        stage.run(ran.append, "timed-out", timeout_s=0.02, deadline=deadline_in(0))
    )
    kept = asyncio.ensure_future(stage.run(ran.append, "kept", deadline=deadline_in(1)))
    await asyncio.sleep(0.001)
    cancelled.cancel()
    with pytest.raises(VoxError) as err:
        await timed_out
    assert err.value.code is ErrorCode.STAGE_TIMEOUT
    assert stage.waiting == 1
    gate.set()
    await asyncio.gather(blocker, kept)
    assert cancelled.cancelled() and ran == ["kept"]
    assert stage.running == 0 and stage.waiting == 0
    # The slot is whole again: two calls in a row each get it at once.
    await stage.run(ran.append, "again")
    await stage.run(ran.append, "again")
    assert ran == ["kept", "again", "again"]


async def test_a_slot_handed_to_a_cancelled_waiter_passes_on(executor: ThreadPoolExecutor) -> None:
    stage, gate, blocker = await _held("asr", executor)
    ran: list[str] = []
    first = asyncio.ensure_future(stage.run(ran.append, "first", deadline=deadline_in(0.1)))
    second = asyncio.ensure_future(stage.run(ran.append, "second", deadline=deadline_in(0.2)))
    await asyncio.sleep(0.001)
    # Hand the slot to `first` and cancel it in the same step, before it can resume.
    stage.running += 1  # stands in for the blocker, whose own release comes later
    stage._release_slot()
    first.cancel()
    await second
    assert ran == ["second"] and first.cancelled()
    gate.set()
    await blocker
    assert stage.running == 0 and stage.waiting == 0


async def test_vad_batch_sizes_are_exported_per_engine(executor: ThreadPoolExecutor) -> None:
    import numpy as np

    from tests.fakes import FakeVad
    from voxserve.observe.metrics import Metrics
    from voxserve.pipeline.scheduling.vad_batch import VadBatcher

    metrics = Metrics()
    stage = EngineStage("vad", concurrency=1, timeout_s=2.0, executor=executor)
    batcher = VadBatcher(FakeVad(), stage, max_wait_ms=20, max_batch=64)
    batcher.on_batch = metrics.observe_batch
    audio = np.zeros(1024, dtype=np.float32)
    await asyncio.gather(*(batcher.speech_probs({}, audio) for _ in range(5)))
    count = metrics.registry.get_sample_value("voxserve_engine_batch_size_count", {"engine": "vad"})
    total = metrics.registry.get_sample_value("voxserve_engine_batch_size_sum", {"engine": "vad"})
    assert (count, total) == (1.0, 5.0)

"""Batcher bounds with a fake batched engine of scripted cost: max_batch, max_wait_ms, at most
max_inflight batches at once (the rest held and counted as waiting), deadline order."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from voxserve.pipeline.scheduling.batcher import Batcher
from voxserve.pipeline.scheduling.stage import EngineStage, deadline_in


class FakeBatchEngine:
    """run_many: records each batch, when it started and how many ran at once."""

    def __init__(self, cost_s: float) -> None:
        self.cost_s = cost_s
        self.batches: list[list[str]] = []
        self.started: list[float] = []
        self.active = 0
        self.peak = 0
        self._lock = threading.Lock()

    def run_many(self, requests: list[str]) -> list[str]:
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.batches.append(list(requests))
            self.started.append(time.perf_counter())
        time.sleep(self.cost_s)
        with self._lock:
            self.active -= 1
        return [r.upper() for r in requests]


def _batcher(
    engine: FakeBatchEngine, *, wait_ms: float, max_batch: int, inflight: int | None, edf: bool
) -> tuple[Batcher[str, str], ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(4)
    stage = EngineStage("asr", concurrency=2, timeout_s=5.0, executor=executor, edf=edf)
    batcher = Batcher(
        "asr",
        stage,
        engine.run_many,
        max_wait_ms=wait_ms,
        max_batch=max_batch,
        max_inflight=inflight,
    )
    return batcher, executor


def _gathering(
    engine: FakeBatchEngine, *, wait_ms: float, mean_gap_s: float
) -> tuple[Batcher[str, str], ThreadPoolExecutor]:
    """A batcher as the ASR one: one batch at a time, waits when one more request is
    expected within the wait, after arrivals `mean_gap_s` apart."""
    batcher, executor = _batcher(engine, wait_ms=wait_ms, max_batch=8, inflight=1, edf=True)
    batcher.min_company = 1.0
    batcher._mean_gap_s = mean_gap_s
    return batcher, executor


@pytest.mark.parametrize("edf", [True, False])
async def test_requests_held_while_busy_run_together_within_max_batch(edf: bool) -> None:
    engine = FakeBatchEngine(cost_s=0.08)
    batcher, executor = _batcher(engine, wait_ms=0, max_batch=3, inflight=1, edf=edf)
    first = asyncio.ensure_future(batcher.submit("r0"))
    await asyncio.sleep(0.02)  # r0 is running alone: a quiet batcher does not wait
    assert engine.batches == [["r0"]]
    # Five sessions' finals end while the engine is busy; the latest arrival is due first.
    dues = {"r1": 0.5, "r2": 0.4, "r3": 0.3, "r4": 0.2, "r5": 0.1}
    held = []
    for name, due in dues.items():
        held.append(asyncio.ensure_future(batcher.submit(name, deadline=deadline_in(due))))
        await asyncio.sleep(0.002)
    assert batcher.pending == 5
    assert batcher.stage.waiting == 2  # two engine calls' worth: visible to flow control
    results = await asyncio.gather(first, *held)
    assert results == ["R0", "R1", "R2", "R3", "R4", "R5"]
    assert [len(b) for b in engine.batches] == [1, 3, 2]  # bounded by max_batch
    if edf:
        assert engine.batches[1] == ["r5", "r4", "r3"]  # the earliest deadlines first
    else:
        assert engine.batches[1] == ["r1", "r2", "r3"]  # arrival order
    assert engine.peak == 1  # never more than max_inflight batches at the engine
    assert batcher.stage.waiting == 0 and batcher.stage.held == 0
    batcher.close()
    executor.shutdown()


async def test_gathering_waits_at_most_max_wait_ms() -> None:
    """When arrivals say company is coming, the first request waits for it, but never
    much longer than max_wait_ms; a request on a quiet batcher goes at once."""
    engine = FakeBatchEngine(cost_s=0.001)
    batcher, executor = _batcher(engine, wait_ms=60, max_batch=64, inflight=None, edf=True)
    t0 = time.perf_counter()
    await batcher.submit("quiet")
    assert engine.started[0] - t0 < 0.03  # no wait without company
    batcher._mean_gap_s = 0.005  # a high recent arrival rate: company is coming
    t1 = time.perf_counter()
    calls = [asyncio.ensure_future(batcher.submit(f"r{i}")) for i in range(3)]
    await asyncio.gather(*calls)
    waited = engine.started[1] - t1
    assert 0.05 <= waited <= 0.06 + 0.15, waited  # the wait was taken and bounded
    assert engine.batches[1] == ["r0", "r1", "r2"]
    batcher.close()
    executor.shutdown()


async def test_max_batch_flushes_without_waiting() -> None:
    engine = FakeBatchEngine(cost_s=0.001)
    batcher, executor = _batcher(engine, wait_ms=5000, max_batch=4, inflight=None, edf=True)
    batcher._mean_gap_s = 0.001  # company expected: a 5 s wait would be taken
    t0 = time.perf_counter()
    results = await asyncio.wait_for(
        asyncio.gather(*(batcher.submit(f"r{i}") for i in range(8))), timeout=2.0
    )
    assert time.perf_counter() - t0 < 1.0
    assert results == [f"R{i}" for i in range(8)]
    assert [len(b) for b in engine.batches] == [4, 4]
    batcher.close()
    executor.shutdown()


async def test_close_cancels_held_requests_and_returns_the_held_count() -> None:
    engine = FakeBatchEngine(cost_s=0.1)
    batcher, executor = _batcher(engine, wait_ms=0, max_batch=8, inflight=1, edf=True)
    running = asyncio.ensure_future(batcher.submit("r0"))
    await asyncio.sleep(0.02)
    held = asyncio.ensure_future(batcher.submit("r1"))
    await asyncio.sleep(0.005)
    assert batcher.stage.held == 1
    batcher.close()
    with pytest.raises(asyncio.CancelledError):
        await held
    with pytest.raises(asyncio.CancelledError):
        await running
    assert batcher.stage.held == 0
    executor.shutdown(wait=True)


async def test_gathering_stays_within_the_first_deadline_slack() -> None:
    """An idle engine waits for company no longer than the first request's deadline less a
    batch's usual run time, even with a longer max_wait_ms."""
    engine = FakeBatchEngine(cost_s=0.001)
    batcher, executor = _gathering(engine, wait_ms=2000, mean_gap_s=0.01)  # company expected
    batcher._run_s = 0.05  # a batch usually takes 50 ms
    t0 = time.perf_counter()
    assert await batcher.submit("r0", deadline=deadline_in(0.25)) == "R0"
    waited = engine.started[0] - t0
    assert 0.17 <= waited <= 0.3, waited  # 0.25 - 0.05, not 2 s
    batcher.close()
    executor.shutdown()


async def test_a_request_due_sooner_shortens_the_wait() -> None:
    engine = FakeBatchEngine(cost_s=0.001)
    batcher, executor = _gathering(engine, wait_ms=1000, mean_gap_s=0.01)
    t0 = time.perf_counter()
    relaxed = asyncio.ensure_future(batcher.submit("relaxed"))  # no deadline: up to 1 s
    await asyncio.sleep(0.01)
    urgent = asyncio.ensure_future(batcher.submit("urgent", deadline=deadline_in(0.08)))
    assert await asyncio.gather(relaxed, urgent) == ["RELAXED", "URGENT"]
    assert engine.batches == [["relaxed", "urgent"]]
    assert engine.started[0] - t0 <= 0.2  # the urgent request's slack, not max_wait
    batcher.close()
    executor.shutdown()


async def test_no_wait_without_expected_company() -> None:
    engine = FakeBatchEngine(cost_s=0.001)
    batcher, executor = _gathering(
        engine, wait_ms=1000, mean_gap_s=5.0
    )  # a request every 5 s: nobody comes within the slack
    t0 = time.perf_counter()
    await batcher.submit("alone", deadline=deadline_in(0.5))
    assert engine.started[0] - t0 < 0.05
    batcher.close()
    executor.shutdown()


async def test_held_requests_past_their_slack_go_at_once_others_gather() -> None:
    """When a batch ends, held requests whose slack is spent run at once; a lone held
    request with slack left waits for company (and the one that comes joins it)."""
    engine = FakeBatchEngine(cost_s=0.15)
    batcher, executor = _gathering(engine, wait_ms=1000, mean_gap_s=0.01)
    first = asyncio.ensure_future(batcher.submit("r0", deadline=deadline_in(0.0)))
    await asyncio.sleep(0.02)
    assert engine.batches == [["r0"]]  # no slack: ran at once
    late = asyncio.ensure_future(batcher.submit("late", deadline=deadline_in(0.05)))
    await asyncio.gather(first, late)  # its slack ran out while r0 ran: no further wait
    assert engine.started[1] - engine.started[0] < 0.15 + 0.05
    roomy = asyncio.ensure_future(batcher.submit("roomy", deadline=deadline_in(0.8)))
    await asyncio.sleep(0.05)
    assert len(engine.batches) == 2  # gathering, not run
    company = asyncio.ensure_future(batcher.submit("company", deadline=deadline_in(0.8)))
    await asyncio.gather(roomy, company)
    assert engine.batches[2] == ["roomy", "company"]
    batcher.close()
    executor.shutdown()


def test_gathering_under_uvloop() -> None:
    """The server runs uvloop, whose handle for a call due now has no `when()`: a request
    arriving while an immediate flush is armed must not fail (it did, failing sessions)."""
    import uvloop

    async def scenario() -> list[str]:
        engine = FakeBatchEngine(cost_s=0.001)
        batcher, executor = _gathering(
            engine, wait_ms=100, mean_gap_s=5.0
        )  # no company expected: the first flush is due now
        calls = [batcher.submit(f"r{i}", deadline=deadline_in(0.01 * i)) for i in range(3)]
        results = await asyncio.gather(*calls)
        batcher.close()
        executor.shutdown()
        return results

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(scenario()) == ["R0", "R1", "R2"]


async def test_no_gathering_while_the_engine_is_mostly_idle() -> None:
    """With `gather_when_busy`, an engine that has been idle runs a request at once even
    when company is expected; once it has been kept busy, the same request waits."""
    engine = FakeBatchEngine(cost_s=0.001)
    batcher, executor = _gathering(engine, wait_ms=1000, mean_gap_s=0.01)  # company expected
    batcher.gather_when_busy = 0.8
    t0 = time.perf_counter()
    await batcher.submit("idle", deadline=deadline_in(0.3))
    assert engine.started[0] - t0 < 0.05  # mostly idle engine: no wait
    assert batcher.busy_share() < 0.1
    batcher._busy, batcher._busy_at = 0.95, time.perf_counter()  # as after a busy spell
    t1 = time.perf_counter()
    await batcher.submit("busy", deadline=deadline_in(0.3))
    assert engine.started[1] - t1 >= 0.2  # gathered within the slack
    batcher.close()
    executor.shutdown()


async def test_busy_share_follows_the_engine() -> None:
    engine = FakeBatchEngine(cost_s=0.2)
    batcher, executor = _batcher(engine, wait_ms=0, max_batch=8, inflight=1, edf=True)
    assert batcher.busy_share() < 0.01
    for i in range(3):
        await batcher.submit(f"r{i}")
    busy = batcher.busy_share()  # busy ~0.6 s of the last ~0.6 s, smoothed over 2 s
    assert 0.2 <= busy <= 0.35, busy
    await asyncio.sleep(0.4)
    assert batcher.busy_share() < busy  # decays while idle
    batcher.close()
    executor.shutdown()

"""Batcher bounds with a fake batched engine of scripted cost: max_batch, max_wait_ms, at most
max_inflight batches at once (the rest held and counted as waiting), deadline order."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from voxserve.pipeline.batcher import Batcher
from voxserve.pipeline.stage import EngineStage, deadline_in


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

"""A batch's cost fitted online as fixed + per request (pipeline/scheduling/batch_cost.py),
the bulk outlook that reads it, and the predicted lateness of held live finals
(pipeline/scheduling/batcher.py)."""

from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from voxserve.pipeline.scheduling.batch_cost import BatchCost, Job, edf_finish, live_lateness
from voxserve.pipeline.scheduling.batcher import Batcher
from voxserve.pipeline.scheduling.stage import EngineStage


def test_nothing_seen_costs_nothing() -> None:
    assert BatchCost().parts() == (0.0, 0.0)
    assert BatchCost().seconds(10, 2) == 0.0


def test_batches_of_one_size_price_per_request() -> None:
    """Sizes all alike: the cost cannot be split, so all of it is per request (errs late
    for bigger batches: 8 requests priced as 8 batches of one)."""
    fit = BatchCost()
    for _ in range(5):
        fit.observe(1, 0.15)
    assert fit.parts() == (0.0, pytest.approx(0.15))
    assert fit.seconds(8, 1) == pytest.approx(1.2)


def test_batches_of_several_sizes_split_the_fixed_part() -> None:
    fit = BatchCost()
    for size in (1, 4, 8, 2, 6, 8, 3):
        fit.observe(size, 0.1 + 0.05 * size)
    fixed, per_item = fit.parts()
    assert fixed == pytest.approx(0.1) and per_item == pytest.approx(0.05)
    assert fit.seconds(16, 2) == pytest.approx(2 * 0.1 + 16 * 0.05)
    assert fit.batch_seconds(8) == pytest.approx(0.5)


def test_it_follows_a_slower_machine_within_a_few_batches() -> None:
    fit = BatchCost(smoothing=0.3)
    for size in (1, 8) * 5:
        fit.observe(size, 0.1 + 0.05 * size)
    for size in (1, 8) * 8:
        fit.observe(size, 2 * (0.1 + 0.05 * size))  # the machine got twice as busy
    assert fit.batch_seconds(8) == pytest.approx(1.0, rel=0.1)


def test_noise_that_would_make_a_part_negative_prices_per_request() -> None:
    fit = BatchCost()
    fit.observe(1, 0.5)
    fit.observe(8, 0.1)  # bigger and faster: no line with both parts >= 0 fits
    fixed, per_item = fit.parts()
    assert fixed >= 0 and per_item >= 0
    assert fit.batch_seconds(1) > 0


def test_edf_finish_serves_in_deadline_order_in_batches() -> None:
    """Batches of at most 2 at 0.1 + 0.1 per request, one slot: the job due first goes
    first whatever its place in the list; a job's end is its last request's batch's."""
    fit = BatchCost()
    for size in (1, 2, 1, 2):
        fit.observe(size, 0.1 + 0.1 * size)
    jobs = [Job(5.0, 2, 2.0), Job(1.0, 1, 1.0), Job(3.0, 1, 1.0)]
    done = edf_finish(jobs, fit, max_batch=2, max_cost=math.inf, slots=1, start_s=0.5)
    # order: job 1, job 2 (batch 0.3 s), job 0's two (batch 0.3 s)
    assert done == [pytest.approx(1.1), pytest.approx(0.8), pytest.approx(0.8)]
    # a cost cap of 1.5 per batch: every request (1.0 each) is a batch of its own
    done = edf_finish(jobs, fit, max_batch=8, max_cost=1.5, slots=1)
    assert done == [pytest.approx(0.8), pytest.approx(0.2), pytest.approx(0.4)]


async def test_work_admitted_and_not_yet_submitted_counts_ahead() -> None:
    """Two uploads admitted in one loop turn: the second's outlook holds the first's
    reserved windows (without them both see an empty queue and a burst is all admitted);
    each submission takes one off, and a release takes the rest."""
    with ThreadPoolExecutor(2) as pool:
        stage = EngineStage("asr", 2, 5.0, pool)
        batcher = Batcher("asr", stage, lambda items: items, max_wait_ms=0, max_batch=8)
        batcher.bulk_cost_fit.observe(1, 0.2)  # 0.2 s a request
        later = time.monotonic() + 10  # the new request's promise: after the others'
        assert batcher.bulk_outlook(later, 1).ahead == 0
        first = batcher.reserve(3, 15.0, time.monotonic() + 5)
        outlook = batcher.bulk_outlook(later, 1)
        assert outlook.ahead == 3 and outlook.done_s == pytest.approx(4 * 0.2, abs=0.01)
        submitted = asyncio.ensure_future(
            batcher.submit_bulk(
                "w",
                deadline=time.monotonic() + 1,
                expires=time.monotonic() + 5,
                cost=5.0,
                reservation=first,
            )
        )
        await asyncio.sleep(0)  # submitted: pending now, no longer reserved
        assert (first.items, first.cost) == (2, 10.0)
        assert batcher.bulk_outlook(later, 1).ahead == 3
        batcher.release(first)
        assert await submitted == "w"
        assert batcher.bulk_outlook(later, 1).ahead == 0
        batcher.close()


async def test_a_request_due_sooner_is_refused_when_it_would_make_admitted_work_late() -> None:
    """EDF serves a request due sooner first: its outlook says how late that makes work
    admitted before it and on time now (the admission rule refuses it then)."""
    with ThreadPoolExecutor(2) as pool:
        stage = EngineStage("asr", 2, 5.0, pool)
        batcher = Batcher("asr", stage, lambda items: items, max_wait_ms=0, max_batch=1)
        batcher.bulk_cost_fit.observe(1, 0.5)  # 0.5 s a request, one a batch
        now = time.monotonic()
        batcher.reserve(2, 2.0, now + 1.05)  # on time: done at 1.0 s
        tight = batcher.bulk_outlook(now + 0.6, 1)  # due sooner: goes first
        assert tight.done_s == pytest.approx(0.5, abs=0.01) and tight.ahead == 0
        assert tight.harms_s == pytest.approx(0.45, abs=0.02)  # the reserved end at 1.5 s
        loose = batcher.bulk_outlook(now + 2.0, 1)  # due later: goes last, harms nobody
        assert loose.done_s == pytest.approx(1.5, abs=0.01) and loose.harms_s == 0
        batcher.close()


def _line(fixed: float, per_item: float) -> BatchCost:
    fit = BatchCost()
    for size in (1, 2, 1, 2):
        fit.observe(size, fixed + per_item * size)
    return fit


def test_live_lateness_serves_held_finals_in_deadline_order_on_the_first_free_slot() -> None:
    """0.1 + 0.1 per final, batches of 2. One slot, busy for 0.25 s: the two due first
    start at 0.25 (0.05 s past the one due at 0.2), the third at 0.55, in time for 1.0.
    A second, idle slot takes the first batch at once and the next at 0.25: on time."""
    fit = _line(0.1, 0.1)
    held = [1.0, 0.3, 0.2]
    assert live_lateness(held, fit, max_batch=2, free_at_s=[0.25]) == pytest.approx(0.05)
    assert live_lateness(held, fit, max_batch=2, free_at_s=[0.25, 0.0]) == 0.0
    assert live_lateness([], fit, max_batch=2, free_at_s=[5.0]) == 0.0


def test_live_lateness_judges_time_not_count() -> None:
    """Sixteen finals that one batch serves in time are not pressure; two behind a long
    batch are, by how late the first would start."""
    cheap = _line(0.02, 0.005)
    assert live_lateness([0.5] * 16, cheap, max_batch=16, free_at_s=[0.0]) == 0.0
    dear = _line(0.3, 0.2)
    assert live_lateness([0.1, 0.4], dear, max_batch=8, free_at_s=[0.5]) == pytest.approx(0.4)


async def test_the_batcher_predicts_its_held_finals_late_from_the_batches_it_ran() -> None:
    """A live batch costs 0.15 s a final (slept): once measured, finals held behind a
    running batch with deadlines shorter than the work ahead are predicted late; with
    room in their deadlines they are not. Before any batch is measured, only a final held
    past its deadline counts (by how much)."""
    with ThreadPoolExecutor(2) as pool:
        stage = EngineStage("asr", 1, 5.0, pool)

        def run_many(items: list[float]) -> list[float]:
            time.sleep(0.15 * len(items))
            return items

        batcher = Batcher("asr", stage, run_many, max_wait_ms=0, max_batch=4, max_inflight=1)
        first = asyncio.ensure_future(batcher.submit(1.0, deadline=time.monotonic() + 5))
        await asyncio.sleep(0.01)  # running, not measured
        overdue = asyncio.ensure_future(batcher.submit(1.0, deadline=time.monotonic() - 0.05))
        soon = asyncio.ensure_future(batcher.submit(1.0, deadline=time.monotonic() + 0.01))
        await asyncio.sleep(0)
        assert batcher.live_cost_fit.batches == 0
        assert batcher.live_lateness() == pytest.approx(0.05, abs=0.02)
        await asyncio.gather(first, overdue, soon)
        assert batcher.live_cost_fit.batches == 2
        running = asyncio.ensure_future(batcher.submit(1.0, deadline=time.monotonic() + 5))
        await asyncio.sleep(0.01)  # its batch runs: the next ones are held
        roomy = [
            asyncio.ensure_future(batcher.submit(1.0, deadline=time.monotonic() + 2))
            for _ in range(3)
        ]
        await asyncio.sleep(0)
        assert batcher.pending == 3 and batcher.live_lateness() == 0.0
        tight = asyncio.ensure_future(batcher.submit(1.0, deadline=time.monotonic() + 0.05))
        await asyncio.sleep(0)
        # The running batch frees the engine in ~0.14 s: the tight final starts ~0.09 late.
        assert batcher.live_lateness() == pytest.approx(0.09, abs=0.04)
        await asyncio.gather(running, tight, *roomy)
        assert batcher.live_lateness() == 0.0
        batcher.close()

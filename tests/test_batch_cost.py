"""A batch's cost fitted online as fixed + per request (pipeline/scheduling/batch_cost.py)."""

from __future__ import annotations

import math

import pytest

from voxserve.pipeline.scheduling.batch_cost import BatchCost, batches_for


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


@pytest.mark.parametrize(
    ("items", "max_batch", "cost", "max_cost", "expected"),
    [
        (0, 8, 0.0, math.inf, 0),
        (1, 8, 0.0, math.inf, 1),
        (17, 8, 0.0, math.inf, 3),
        (4, 8, 60.0, 20.0, 3),  # four 15 s windows: 20 s of audio a batch
        (16, 8, 10.0, 20.0, 2),
    ],
)
def test_batches_for(
    items: int, max_batch: int, cost: float, max_cost: float, expected: int
) -> None:
    assert batches_for(items, max_batch, cost, max_cost) == expected

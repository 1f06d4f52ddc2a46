"""The pacing schedule: start spread, the frame clock, marks, arrivals, worker split."""

from __future__ import annotations

import itertools

import pytest

from voxserve.bench.schedule import (
    FRAME_S,
    FrameClock,
    arrivals,
    mark_due,
    split_evenly,
    start_offsets,
)


def test_start_offsets_spread_over_the_ramp() -> None:
    offsets = start_offsets(4, 2.0)
    assert [round(o, 1) for o in offsets] == [0.0, 0.5, 1.0, 1.5]
    assert all(i * 0.5 <= o < i * 0.5 + FRAME_S for i, o in enumerate(offsets))
    assert start_offsets(3, 0.0) == [0.0, 0.0, 0.0]
    assert start_offsets(0, 1.0) == []
    with pytest.raises(ValueError):
        start_offsets(-1, 1.0)


def test_frame_clock_is_20ms_by_the_wall_clock() -> None:
    clock = FrameClock(100.0)
    assert clock.due(0) == 100.0
    assert clock.due(50) == pytest.approx(101.0)
    # frames due strictly before t: 0.02 * 150 = 3 s
    assert clock.frames_before(103.0) == 150
    assert clock.frames_before(103.001) == 151
    assert clock.frames_before(99.0) == 0


def test_marks_every_n_frames_with_a_phase() -> None:
    sent = [k for k in range(100) if mark_due(k, 25, 0)]
    assert sent == [24, 49, 74, 99]
    shifted = [k for k in range(100) if mark_due(k, 25, 3)]
    assert shifted == [21, 46, 71, 96]
    assert not any(mark_due(k, 0, 0) for k in range(10))


def test_uniform_and_poisson_arrivals() -> None:
    assert arrivals(4, 1.0, poisson=False) == [0.0, 0.25, 0.5, 0.75]
    times = arrivals(50, 20.0, poisson=True, seed=1)
    assert times == sorted(times) and all(0 <= t < 20 for t in times)
    assert 850 < len(times) < 1150  # 1000 expected
    assert arrivals(50, 20.0, poisson=True, seed=1) == times  # seeded
    assert arrivals(0, 5.0, poisson=True) == []


def test_split_evenly() -> None:
    assert split_evenly(10, 3) == [(0, 4), (4, 3), (7, 3)]
    assert split_evenly(2, 1) == [(0, 2)]
    with pytest.raises(ValueError):
        split_evenly(5, 0)


def test_start_offsets_spread_the_streams_frame_phases() -> None:
    """5 s over 100 streams is 50 ms a stream: evenly spread starts alone give two 20 ms
    phases (50 frames arriving together every 10 ms); the phases must cover the period."""
    phases = sorted(o % FRAME_S for o in start_offsets(100, 5.0))
    gaps = [b - a for a, b in itertools.pairwise(phases)]
    gaps.append(phases[0] + FRAME_S - phases[-1])
    assert max(gaps) < 0.1 * FRAME_S
    assert len({round(p, 4) for p in phases}) > 90

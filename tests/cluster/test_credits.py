"""The gateway's per-tier credit window (AIMD): pure, no Ray."""

from __future__ import annotations

import threading
import time

import pytest

from voxserve.config import ClusterCredits
from voxserve.engines.credits import TierCredits


def window(**config: float) -> TierCredits:
    return TierCredits("tts", ClusterCredits(**config))  # type: ignore[arg-type]


def test_refusals_and_misses_halve_the_window_down_to_its_floor() -> None:
    credits = window(initial=8, min=2, max=16)
    for expected in (4, 2, 2):
        assert credits.acquire(0)
        credits.refused()
        assert credits.limit == expected
    assert credits.acquire(0)
    credits.missed()
    assert credits.limit == 2 and credits.refusals == 3 and credits.misses == 1
    assert credits.in_flight == 0


def test_successes_grow_it_by_about_one_per_window_of_calls_up_to_max() -> None:
    credits = window(initial=4, min=1, max=6)
    for _ in range(4):  # one window's worth of successes: +1
        assert credits.acquire(0)
        credits.success()
    assert credits.window == pytest.approx(4.92, abs=0.01)  # 4 + 1/4 + 1/4.25 + ...
    assert credits.limit == 4
    for _ in range(100):
        assert credits.acquire(0)
        credits.success()
    assert credits.limit == 6  # capped at max


def test_a_full_window_refuses_after_the_wait_and_a_release_admits_a_waiter() -> None:
    credits = window(initial=1, min=1, max=4, wait_ms=50)
    assert credits.acquire()
    started = time.monotonic()
    assert not credits.acquire()  # full: refused after wait_ms
    assert time.monotonic() - started >= 0.04
    assert credits.rejected == 1

    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(credits.acquire(5.0)))
    waiter.start()
    time.sleep(0.05)
    assert not got  # still waiting
    credits.release()
    waiter.join(2)
    assert got == [True] and credits.in_flight == 1


def test_bad_bounds_are_rejected() -> None:
    with pytest.raises(ValueError, match="min <= initial <= max"):
        window(initial=8, min=1, max=4)

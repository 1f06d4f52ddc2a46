"""When to send: stream start offsets, the 20 ms frame clock, request arrival times.

Everything is a pure function of a base time, so a test can check the schedule without a
clock; the clients compare it with `time.monotonic()`, which on Linux is one clock for every
process of the machine, so several load processes can share one start time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FRAME_S = 0.020


def start_offsets(streams: int, ramp_s: float) -> list[float]:
    """Evenly spread start times over [0, ramp_s): streams do not connect, nor send their
    frames, in lock-step (each stream's 20 ms phase is set by its start)."""
    if streams < 0 or ramp_s < 0:
        raise ValueError("streams and ramp_s must be >= 0")
    return [i * ramp_s / streams for i in range(streams)] if streams else []


@dataclass(frozen=True, slots=True)
class FrameClock:
    """Frame k of a stream is due at base + k * period, by the wall clock."""

    base: float
    period: float = FRAME_S

    def due(self, k: int) -> float:
        return self.base + k * self.period

    def frames_before(self, t: float) -> int:
        """How many frames are due strictly before time t (the stream stops at t)."""
        if t <= self.base:
            return 0
        n = int((t - self.base) / self.period)
        while self.due(n) < t:
            n += 1
        while n and self.due(n - 1) >= t:
            n -= 1
        return n


def mark_due(k: int, every_frames: int, phase: int) -> bool:
    """Send a mark after frame k? Each stream has its own phase so marks do not bunch."""
    return every_frames > 0 and (k + phase) % every_frames == every_frames - 1


def arrivals(rate: float, duration_s: float, *, poisson: bool, seed: int = 0) -> list[float]:
    """Request times in [0, duration_s) at `rate` per second: evenly spaced, or a Poisson
    process (exponential gaps) which is what independent clients look like."""
    if rate <= 0 or duration_s <= 0:
        return []
    if not poisson:
        return [i / rate for i in range(int(rate * duration_s))]
    rng = random.Random(seed)
    times: list[float] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def split_evenly(total: int, parts: int) -> list[tuple[int, int]]:
    """(first, count) for each of `parts` workers: streams 0..total-1 dealt out in blocks."""
    if parts < 1:
        raise ValueError("parts must be >= 1")
    base, extra = divmod(total, parts)
    out, first = [], 0
    for i in range(parts):
        count = base + (1 if i < extra else 0)
        out.append((first, count))
        first += count
    return out

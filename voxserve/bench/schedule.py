"""When to send: stream start offsets, the 20 ms frame clock, request arrival times.

Everything is a pure function of a base time, so a test can check the schedule without a
clock; the clients compare it with `time.monotonic()`, which on Linux is one clock for every
process of the machine, so several load processes can share one start time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FRAME_S = 0.020


GOLDEN = (5**0.5 - 1) / 2  # the golden-ratio sequence: phases spread for any count of streams


def start_offsets(streams: int, ramp_s: float) -> list[float]:
    """Start times spread over [0, ramp_s), each moved less than a frame period later so
    that the streams' 20 ms phases are spread as evenly as their starts: the even spread
    alone put every stream on one or two phases whenever ramp_s / streams is a multiple of
    10 ms (5 s over 100 streams: 50 frames arriving at once every 10 ms, a burst that live
    callers never make together). ramp_s 0: all at once, in lock-step (a burst test)."""
    if streams < 0 or ramp_s < 0:
        raise ValueError("streams and ramp_s must be >= 0")
    if ramp_s == 0:
        return [0.0] * streams
    step = ramp_s / streams if streams else 0.0
    offsets = []
    for i in range(streams):
        phase = (i * GOLDEN) % 1.0 * FRAME_S
        offsets.append(i * step + (phase - i * step) % FRAME_S)
    return offsets


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

"""A per-stage profiler: mean, P50 and P99 over the last N latencies of each stage.

Prometheus histograms answer "how has latency been over time" with bucket resolution; an
operator looking at one slow server wants exact recent figures per stage without a
Prometheus at hand (`GET /debug/stats`, `voxserve stats`). Observing is one deque append;
sorting happens only when someone asks.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

DEFAULT_WINDOW = 2048  # latencies kept per stage: enough for a stable P99, ~16 KiB each


@dataclass(frozen=True, slots=True)
class StageSummary:
    """One stage's figures over its window (seconds)."""

    stage: str
    count: int
    mean_s: float
    p50_s: float
    p99_s: float
    max_s: float

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "stage": self.stage,
            "count": self.count,
            "mean_ms": round(self.mean_s * 1000, 3),
            "p50_ms": round(self.p50_s * 1000, 3),
            "p99_ms": round(self.p99_s * 1000, 3),
            "max_ms": round(self.max_s * 1000, 3),
        }


def _quantile(ordered: list[float], q: float) -> float:
    """Nearest-rank quantile of a sorted, non-empty list."""
    index = min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))
    return ordered[index]


class StageProfiler:
    """Sliding windows of latencies by stage name, summarised on request."""

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self.started = time.time()
        self._samples: dict[str, deque[float]] = {}

    def observe(self, stage: str, seconds: float) -> None:
        samples = self._samples.get(stage)
        if samples is None:
            samples = self._samples[stage] = deque(maxlen=self.window)
        samples.append(seconds)

    def summary(self) -> list[StageSummary]:
        """Every stage seen so far, by name. Copies each window first, so a summary taken
        from another thread never iterates a deque the loop is appending to."""
        out = []
        for stage, samples in sorted(list(self._samples.items())):
            ordered = sorted(list(samples))
            if not ordered:
                continue
            out.append(
                StageSummary(
                    stage,
                    len(ordered),
                    sum(ordered) / len(ordered),
                    _quantile(ordered, 0.5),
                    _quantile(ordered, 0.99),
                    ordered[-1],
                )
            )
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "window": self.window,
            "since": self.started,
            "stages": [item.as_dict() for item in self.summary()],
        }

"""How late the server's outgoing WebRTC frames were during a step, from the
`voxserve_webrtc_frame_lag_seconds` histogram on /metrics (read before and after the step):
the server's own pacing of every call's reply track, 20 ms frames, silence included.

Percentiles come from the bucket counts, so a figure is the bucket's upper bound ("P99 <=
20 ms" is exact at the 20 ms edge, the budget); past the last finite bucket it is None.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

METRIC = "voxserve_webrtc_frame_lag_seconds"
Buckets = dict[float, float]  # upper bound (s; inf for +Inf) -> cumulative count


def read(http_base: str, timeout_s: float = 5.0) -> Buckets | None:
    """The histogram's cumulative buckets now; None if /metrics has no such histogram."""
    try:
        response = httpx.get(f"{http_base}/metrics", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    out: Buckets = {}
    try:
        for family in text_string_to_metric_families(response.text):
            if family.name != METRIC:
                continue
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    out[float(sample.labels["le"])] = sample.value
    except ValueError:
        return None
    return out or None


def during(before: Buckets | None, after: Buckets | None) -> Buckets | None:
    """The frames of the step alone (after - before), cumulative by bound."""
    if after is None:
        return None
    return {le: n - (before or {}).get(le, 0.0) for le, n in after.items()}


def pooled(parts: Iterable[Mapping[float, float] | None]) -> Buckets | None:
    out: Buckets = {}
    for part in parts:
        for le, n in (part or {}).items():
            out[le] = out.get(le, 0.0) + n
    return out or None


def quantile_ms(buckets: Mapping[float, float], q: float) -> float | None:
    """The upper bound (ms) of the bucket holding the q-quantile; None past the last
    finite bound or without frames."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return None
    for le in bounds:
        if buckets[le] >= q * total:
            return None if math.isinf(le) else round(le * 1000, 3)
    return None


def summary(buckets: Mapping[float, float] | None) -> dict[str, Any] | None:
    """count, p50/p90/p99 (ms, bucket upper bounds) and the share of frames over 20 ms."""
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    on_time = max((n for le, n in buckets.items() if le <= 0.02 + 1e-9), default=0.0)
    return {
        "count": int(total),
        "p50": quantile_ms(buckets, 0.50),
        "p90": quantile_ms(buckets, 0.90),
        "p99": quantile_ms(buckets, 0.99),
        "over_20ms_share": round(1 - on_time / total, 5),
    }


def to_json(buckets: Mapping[float, float] | None) -> dict[str, float] | None:
    """Bounds as Prometheus writes them ("0.02", "+Inf"): JSON keys are strings."""
    if buckets is None:
        return None
    return {("+Inf" if math.isinf(le) else repr(le)): n for le, n in sorted(buckets.items())}


def from_json(data: Mapping[str, float] | None) -> Buckets | None:
    return None if data is None else {float(le): n for le, n in data.items()}

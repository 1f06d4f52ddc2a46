"""Batch sizes the server's cross-session batchers ran during a step, from the
`voxserve_engine_batch_size` histogram on /metrics (read before and after the step): whether
batching happened at all is what explains a throughput-per-core figure."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

METRIC = "voxserve_engine_batch_size"
Reading = dict[str, dict[str, float]]  # engine -> {"count", "sum", "le=<bound>": cumulative}


def read(http_base: str, timeout_s: float = 5.0) -> Reading | None:
    """The histogram's samples per engine now; None if /metrics cannot be read."""
    try:
        response = httpx.get(f"{http_base}/metrics", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:  # e.g. the bare echo server: no metrics
        return None
    out: Reading = {}
    try:
        families = list(text_string_to_metric_families(response.text))
    except ValueError:
        return None
    for family in families:
        if family.name != METRIC:
            continue
        for sample in family.samples:
            engine = sample.labels.get("engine", "")
            values = out.setdefault(engine, {})
            if sample.name.endswith("_count"):
                values["count"] = sample.value
            elif sample.name.endswith("_sum"):
                values["sum"] = sample.value
            elif sample.name.endswith("_bucket"):
                values[f"le={sample.labels['le']}"] = sample.value
    return out


def during(before: Reading | None, after: Reading | None) -> dict[str, Any] | None:
    """Per engine: batches run between the readings, their mean size and the share of
    batches of one request (a batcher that never gathers shows 1.0)."""
    if before is None or after is None:
        return None
    out: dict[str, Any] = {}
    for engine, now in after.items():
        then = before.get(engine, {})
        batches = now.get("count", 0.0) - then.get("count", 0.0)
        if batches <= 0:
            continue
        requests = now.get("sum", 0.0) - then.get("sum", 0.0)
        ones = now.get("le=1.0", 0.0) - then.get("le=1.0", 0.0)
        out[engine] = {
            "batches": int(batches),
            "requests": int(requests),
            "mean_size": round(requests / batches, 2),
            "share_of_one": round(ones / batches, 3),
        }
    return out

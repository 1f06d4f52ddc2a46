"""Is a step's figure the server's? And did it stay within the budget? Pure checks.

A step is valid only when the load generator kept its schedule (P99 send lateness <= 10 ms)
and no load process used more than 90% of a core: past that, lateness measured at the server
could be the generator's own. A step breaks the budget when the chosen latency's P99 is over
the budget, or more than 1% of the streams failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MAX_LATENESS_P99_MS = 10.0
MAX_GENERATOR_CPU = 90.0  # percent of one core, per load process
MAX_ERROR_RATE = 0.01


def generator_problems(
    lateness_p99_ms: float | None,
    cpu_percents: Sequence[float | None],
    errors: Mapping[str, int],
    *,
    max_lateness_ms: float = MAX_LATENESS_P99_MS,
    max_cpu: float = MAX_GENERATOR_CPU,
) -> list[str]:
    """Why the load generator may have been the bottleneck (empty: it was not)."""
    problems = []
    if lateness_p99_ms is not None and lateness_p99_ms > max_lateness_ms:
        problems.append(
            f"load generator behind schedule: P99 send lateness {lateness_p99_ms:.1f} ms "
            f"> {max_lateness_ms:g} ms"
        )
    busiest = max((c for c in cpu_percents if c is not None), default=None)
    if busiest is not None and busiest > max_cpu:
        problems.append(f"a load process used {busiest:.0f}% of a core (> {max_cpu:g}%)")
    if errors.get("worker_lost"):
        problems.append(f"{errors['worker_lost']} load process(es) did not report in time")
    return problems


def budget_problems(
    record: Mapping[str, Any],
    metric: str,
    budget_ms: float,
    *,
    max_error_rate: float = MAX_ERROR_RATE,
) -> list[str]:
    """Why a step breaks the budget (empty: within it). No sample at all is a break too:
    a step that measured nothing cannot show it met the budget."""
    problems = []
    summary = record.get("latency_ms", {}).get(metric) or {}
    p99 = summary.get("p99")
    if p99 is None:
        problems.append(f"no {metric} measured")
    elif p99 > budget_ms:
        problems.append(f"{metric} P99 {p99:.1f} ms > budget {budget_ms:g} ms")
    rate = float(record.get("error_rate") or 0.0)
    if rate > max_error_rate:
        problems.append(f"{rate:.1%} of streams failed (> {max_error_rate:.0%})")
    return problems


def knee(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The last step that was valid and within budget, before the first that was not."""
    last_good: Mapping[str, Any] | None = None
    for record in records:
        if record.get("within_budget") and record.get("valid"):
            last_good = record
            continue
        return {
            "streams": last_good["streams"] if last_good else None,
            "broke_at": record["streams"],
            "why": (record.get("budget_problems") or []) + (record.get("invalid_reasons") or []),
            "limited_by": "server" if record.get("valid") else "load generator",
        }
    return {
        "streams": last_good["streams"] if last_good else None,
        "broke_at": None,
        "why": ["every step was within budget"],
        "limited_by": "steps ran out",
    }

"""Validity (was the load generator the bottleneck?) and the ramp's budget and knee."""

from __future__ import annotations

from typing import Any

from voxserve.bench.verdict import budget_problems, generator_problems, knee


def test_generator_within_limits_is_valid() -> None:
    assert generator_problems(2.0, [40.0, 55.0], {}) == []
    assert generator_problems(None, [None], {}) == []


def test_generator_lateness_cpu_and_lost_workers_invalidate() -> None:
    problems = generator_problems(12.5, [95.0, 20.0], {"worker_lost": 1})
    assert len(problems) == 3
    assert "12.5 ms" in problems[0] and "95%" in problems[1] and "1 load" in problems[2]


def _record(p99: float | None, error_rate: float = 0.0, **more: Any) -> dict[str, Any]:
    latency = {} if p99 is None else {"mark_lag": {"p99": p99}}
    return {"latency_ms": latency, "error_rate": error_rate, **more}


def test_budget() -> None:
    assert budget_problems(_record(15.0), "mark_lag", 20) == []
    assert budget_problems(_record(25.0), "mark_lag", 20) == ["mark_lag P99 25.0 ms > budget 20 ms"]
    assert budget_problems(_record(5.0, 0.02), "mark_lag", 20) == ["2.0% of streams failed (> 1%)"]
    assert budget_problems(_record(None), "mark_lag", 20) == ["no mark_lag measured"]


def _step(streams: int, ok: bool, valid: bool = True) -> dict[str, Any]:
    return {
        "streams": streams,
        "within_budget": ok,
        "valid": valid,
        "budget_problems": [] if ok else ["over"],
    }


def test_knee_is_the_last_good_step() -> None:
    found = knee([_step(50, True), _step(100, True), _step(200, False)])
    assert found["streams"] == 100 and found["broke_at"] == 200
    assert found["limited_by"] == "server"


def test_knee_when_the_generator_gave_out() -> None:
    found = knee([_step(50, True), _step(100, True, valid=False)])
    assert found["streams"] == 50 and found["limited_by"] == "load generator"


def test_knee_when_nothing_broke_or_everything_did() -> None:
    assert knee([_step(50, True)])["broke_at"] is None
    assert knee([_step(50, False)])["streams"] is None

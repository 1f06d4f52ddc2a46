"""Hypothesis profiles: `ci` (default) keeps the fuzz tests to seconds; `long` is for runs on
demand: HYPOTHESIS_PROFILE=long .venv/bin/pytest tests/fuzz (docs/reliability.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

FUZZ_DIR = Path(__file__).parent

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "long", max_examples=20_000, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The fuzz tests run without the coverage tracer: under it they take twice as long
    (hypothesis makes many small calls), and the wire parsers they fuzz are covered by the
    example tests already (scripts/coverage_areas.py shows them)."""
    for item in items:
        if item.path.parent == FUZZ_DIR:
            item.add_marker(pytest.mark.no_cover)

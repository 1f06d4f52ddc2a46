"""Hypothesis profiles: `ci` (default) keeps the fuzz tests to seconds; `long` is for runs on
demand: HYPOTHESIS_PROFILE=long .venv/bin/pytest tests/fuzz (docs/reliability.md)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "long", max_examples=20_000, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

"""Installed distribution versions, for EngineInfo (cache keys change when a model package does)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def dist_version(distribution: str) -> str:
    """Version of an installed distribution, or "unknown" when it is not installed as one."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"

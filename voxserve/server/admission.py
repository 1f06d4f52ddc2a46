"""Who may open a session now: the rule every streaming transport applies first."""

from __future__ import annotations

from voxserve.errors import ErrorCode, VoxError
from voxserve.runtime import Runtime


def admit(runtime: Runtime) -> None:
    """Refuse at once (fatal) while the models load or when `limits.max_sessions` sessions
    are open, so a refused client learns it before sending any audio."""
    if not runtime.ready:
        raise VoxError(ErrorCode.NOT_READY, "models are still loading; retry shortly", fatal=True)
    limit = runtime.settings.limits.max_sessions
    if runtime.active_sessions >= limit:
        raise VoxError(
            ErrorCode.OVERLOADED,
            f"server is at its limit of {limit} sessions; retry later",
            fatal=True,
        )

"""The few events the session driver and the transports build themselves (the Session
builds the rest), and the errors of the two session limits. Kept here, small, so the wire
vocabulary has one place to change."""

from __future__ import annotations

from voxserve.config import LimitsConfig
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import ErrorEvent, SessionResumed
from voxserve.pipeline.session import Session


def error_event(error: VoxError, trace_id: str | None = None) -> ErrorEvent:
    """An `error` event; an internal one carries the trace id, to find the server's log."""
    if trace_id is not None and error.code is ErrorCode.INTERNAL:
        return error.to_event(trace_id=trace_id)
    return error.to_event()


def refusal_event(error: VoxError, *, try_again: bool) -> ErrorEvent:
    """The error of a session refused at open; one worth retrying always says when."""
    return error.to_event(retry_after_ms=1000) if try_again else error.to_event()


def resumed_event(session: Session) -> SessionResumed:
    """What a reconnecting client needs: send audio after `acked_seq` again."""
    return SessionResumed(
        session_id=session.id,
        trace_id=session.trace_id,
        acked_seq=session.acked_seq,
        credit_window=session.credit.size if session.credit else None,
    )


def internal_error() -> VoxError:
    """A bug ended the session: the client learns that, never the details."""
    return VoxError(ErrorCode.INTERNAL, "internal error; see server logs", fatal=True)


def limit_error(
    limits: LimitsConfig,
    *,
    expired: bool,
    fatal: bool = True,
    unit: str = "sessions",
    message: str = "message",
) -> VoxError:
    """`session_expired` past `max_session_s`, else `idle_timeout` after `idle_timeout_s`
    without a client `message` (Wyoming: connections, events, not fatal)."""
    if expired:
        limit = limits.max_session_s
        return VoxError(ErrorCode.SESSION_EXPIRED, f"{unit} last at most {limit:g} s", fatal=fatal)
    idle = limits.idle_timeout_s
    return VoxError(
        ErrorCode.IDLE_TIMEOUT, f"no {message} from the client for {idle:g} s", fatal=fatal
    )

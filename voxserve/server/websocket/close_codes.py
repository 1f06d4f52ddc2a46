"""The WebSocket close codes voxserve sends (RFC 6455 section 7.4.1), for every door on a
WebSocket (/v1/stream, /v1/realtime) and the Host guard: one list, so a client reads the
same code for the same reason whichever route it took; `refusal` applies it to a refused
connection."""

from __future__ import annotations

from voxserve.errors import ErrorCode, VoxError
from voxserve.events import ErrorEvent
from voxserve.server.session.events import refusal_event

CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008  # the client broke the protocol (or was refused for good)
CLOSE_INTERNAL = 1011
CLOSE_TRY_AGAIN = 1013  # overloaded or not ready: retry later
TRY_AGAIN = (  # a refusal with one of these codes closes CLOSE_TRY_AGAIN, others CLOSE_POLICY
    ErrorCode.OVERLOADED,
    ErrorCode.NOT_READY,
    ErrorCode.QUOTA_EXCEEDED,
    ErrorCode.SHUTTING_DOWN,
)


def refusal(error: VoxError) -> tuple[ErrorEvent, int]:
    """A connection refused before its session opened: the error event to send (a retryable
    one says when to retry) and the close code after it (`TRY_AGAIN` above)."""
    try_again = error.code in TRY_AGAIN
    code = CLOSE_TRY_AGAIN if try_again else CLOSE_POLICY
    return refusal_event(error, try_again=try_again), code

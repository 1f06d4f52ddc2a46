"""HTTP/1.1 connections with the limits uvicorn's protocol lacks.

uvicorn times out only the idle time between two requests of a keep-alive connection. A
connection that sends nothing, or its headers a byte at a time, or stops in the middle of
a body nobody reads, was kept for ever; a few hundred of them took every descriptor the
process had, and from then on every new connection (/healthz's too) was closed at accept.
`GuardedHttpProtocol` is uvicorn's httptools protocol plus:

- a header timeout: a request's headers must be complete `header_timeout_s` after the
  connection opened, or after bytes arrived while no request was being answered (the next
  request, or the rest of a body the app did not read): else 408 `client_stalled`, closed;
- a connection cap with descriptor headroom (`default_max_connections`): over
  `max_connections` open connections (HTTP and WebSocket together) the HTTP connection
  whose client has been silent the longest while the server waits for it (idle between
  requests, in its headers, or in a body) is closed to make room; with none to close, the
  new one is answered 503 `overloaded` and closed at once;
- an unread-response timeout: a response of which the client reads nothing for
  `stalled_s` (the transport's buffer over its high-water mark, and not shrinking) is
  aborted, so a client that stops reading cannot hold a connection and its task for ever.

A request body's read timeout is the app's (server/http/guards.py `BodyTimeout`): the app
knows when it waits for body, and answers 408 itself.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from voxserve.errors import ErrorCode, VoxError
from voxserve.server.session.errors import error_response
from voxserve.server.session.request_id import REQUEST_ID_HEADER, TRACE_HEADER, new_trace_id

log = logging.getLogger(__name__)

# The uvicorn methods the subclass extends; checked at import so that a uvicorn that changed
# them runs its own protocol (without these limits, with a warning) instead of breaking.
_HOOKS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_headers_complete",
    "on_message_complete",
    "on_response_complete",
    "handle_websocket_upgrade",
    "pause_writing",
    "resume_writing",
)
HEADROOM_MIN = 64
_ABORT_AFTER_S = 1.0  # a closed connection whose client reads nothing is aborted after this


def default_max_connections(nofile: int | None = None) -> int:
    """Connections a process with `nofile` descriptors (default: its soft RLIMIT_NOFILE)
    may hold: the limit less a headroom of an eighth of it, at least 64, for what is not a
    client connection (about 20 on a server with the default engines: models, onnxruntime,
    the cache's sqlite files, logs, the event loop, listening sockets, gRPC and Wyoming
    connections, which are counted by their own session limits). At least 16."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if nofile == resource.RLIM_INFINITY:
            nofile = 1 << 20
    return max(16, nofile - max(HEADROOM_MIN, nofile // 8))


@dataclass
class ConnectionLimits:
    """One server's limits and its shared state: the HTTP connections that may be closed to
    make room, least recently heard from first, and the counters."""

    max_connections: int
    header_timeout_s: float
    stalled_s: float
    count_closed: Callable[[str], None] = lambda reason: None
    count_error: Callable[[ErrorCode], None] = lambda code: None
    waiting: dict[Any, None] = field(default_factory=dict)

    def touch(self, protocol: Any) -> None:
        """`protocol`'s client was just heard from while the server waits for it."""
        self.waiting.pop(protocol, None)
        self.waiting[protocol] = None

    def make_room(self, newcomer: Any) -> bool:
        """Close the connection silent the longest while waited for; False if none is."""
        for protocol in self.waiting:
            if protocol is not newcomer:
                self.waiting.pop(protocol)
                protocol.evict()
                self.count_closed("evicted")
                return True
        return False


def _error_response(error: VoxError) -> bytes:
    """A whole HTTP/1.1 response for `error` (server/session/errors.py's status, headers and body),
    written by the protocol where no app is running to answer; the connection closes. It
    names itself as every answer does (server/session/request_id.py), with a new id."""
    response = error_response(error)
    status = response.status_code
    trace_id = new_trace_id()
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n".encode()]
    head += [name + b": " + value + b"\r\n" for name, value in response.raw_headers]
    head += [f"{name}: {trace_id}\r\n".encode() for name in (REQUEST_ID_HEADER, TRACE_HEADER)]
    return b"".join([*head, b"connection: close\r\n\r\n", bytes(response.body)])


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of the module docstring; the limits are
    the class attribute `limits` of the subclass `http_protocol` makes per server."""

    limits: ConnectionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._unread_bytes = 0  # the write buffer when last seen while writing was paused
        self._message_open = False  # between a request's first byte and its last
        self._lost = False

    # -- state ----------------------------------------------------------------------------

    def _answering(self) -> bool:
        """A request's headers are in and its response is not complete."""
        return self.cycle is not None and not self.cycle.response_complete

    def _arm_header_timer(self) -> None:
        if self._header_timer is None and not self._lost:
            self._header_timer = self.loop.call_later(
                self.limits.header_timeout_s, self._header_timeout
            )

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    # -- uvicorn's protocol, extended -----------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        limits = self.limits
        if len(self.connections) > limits.max_connections and not limits.make_room(self):
            self._refuse()
            return
        limits.touch(self)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.limits.waiting.pop(self, None)
        self._disarm_header_timer()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._answering():
            # The next request, or the rest of a body already answered: headers are due.
            self._arm_header_timer()
        if self in self.limits.waiting:
            self.limits.touch(self)
        super().data_received(data)

    def on_message_begin(self) -> None:
        self._message_open = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._message_open = False
        super().on_message_complete()
        if self._answering():
            # The whole request is in: the server works, the client waits. Not evictable.
            self.limits.waiting.pop(self, None)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing() or self._answering():
            return  # closed, or a pipelined request was started
        self.limits.touch(self)  # idle (keep-alive), or the rest of an unread body
        if self._message_open:
            self._arm_header_timer()

    def handle_websocket_upgrade(self) -> None:
        # The WebSocket protocol takes the transport (its own limits: the handshake timeout,
        # the session limits); this protocol never hears from it again.
        self.limits.waiting.pop(self, None)
        self._disarm_header_timer()
        super().handle_websocket_upgrade()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None and not self._lost:
            self._unread_bytes = self.transport.get_write_buffer_size()
            self._write_timer = self.loop.call_later(self.limits.stalled_s, self._unread)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    # -- endings --------------------------------------------------------------------------

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self._lost or self.transport.is_closing():
            return
        if self._answering():
            # Pipelined headers behind a response still being sent: due after it.
            self._arm_header_timer()
            return
        timeout = self.limits.header_timeout_s
        self._reject(
            "header_timeout",
            VoxError(
                ErrorCode.CLIENT_STALLED, f"request headers not complete within {timeout:g} s"
            ),
        )

    def _refuse(self) -> None:
        self.limits.waiting.pop(self, None)
        self._reject(
            "refused", VoxError(ErrorCode.OVERLOADED, "too many open connections; retry later")
        )

    def _reject(self, reason: str, error: VoxError) -> None:
        """Answer `error` and close, counted as closed for `reason` and as the error."""
        self.limits.count_closed(reason)
        self.limits.count_error(error.code)
        self._close_with(_error_response(error))

    def evict(self) -> None:
        """Closed to make room for a new connection (ConnectionLimits.make_room)."""
        self._disarm_header_timer()
        if self._answering():
            self.transport.abort()  # the app reading the body sees a disconnect
        else:
            self._close_with(b"")

    def _unread(self) -> None:
        """Writing has been paused `stalled_s`: aborted if the client read nothing since
        (the buffer only shrinks while paused: the app's sends wait for it)."""
        self._write_timer = None
        if self._lost:
            return
        left = self.transport.get_write_buffer_size()
        if left < self._unread_bytes:  # slow, but reading
            self._unread_bytes = left
            self._write_timer = self.loop.call_later(self.limits.stalled_s, self._unread)
            return
        log.info("http client read nothing of its response; connection aborted")
        self.limits.count_closed("unread_response")
        self.transport.abort()

    def _close_with(self, response: bytes) -> None:
        """Write `response` (if any) and close; aborted if the client does not take it."""
        transport = self.transport
        if response:
            transport.write(response)
        transport.close()
        self.loop.call_later(_ABORT_AFTER_S, self._abort_unless_lost)

    def _abort_unless_lost(self) -> None:
        if not self._lost:
            self.transport.abort()


def http_protocol(limits: ConnectionLimits) -> type[Any] | str:
    """The protocol class for uvicorn's `http` setting, bound to `limits`."""
    if not all(hasattr(HttpToolsProtocol, name) for name in _HOOKS):
        log.warning("uvicorn's httptools protocol changed: HTTP runs without voxserve's limits")
        return "auto"
    return type("BoundGuardedHttpProtocol", (GuardedHttpProtocol,), {"limits": limits})

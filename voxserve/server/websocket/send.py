"""A WebSocket connection's output outside uvicorn's ASGI send, and whether it is read.

`DirectSendProtocol` is uvicorn's websockets-sansio protocol plus what the session writes
without the ASGI message, the awaits and Starlette's state checks (`send_text`: its events,
one per mark, turn and transcript) and the stalled-reader check (server/websocket/stall.py): once
the session's switch is watched (`watch_stalls`), output written is followed by pings
whose pongs say the client read it, and a client that reads nothing for the stall time
while output waits is handed to the session's `on_stall` and closed with 1008
`client_stalled` (`close_stalled`), written behind what it has not read (the socket is
aborted if it still reads nothing). The keepalive's own missing pong counts the same while
output waits; without output it stays uvicorn's (1011).

The audio fast path (server/websocket/fastpath.py) is built on it; this module holds only what
touches uvicorn's state on the way out.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State

from voxserve.server.websocket.close_codes import CLOSE_POLICY
from voxserve.server.websocket.stall import StallSwitch, StallWatch

STALLED = "client_stalled"
STALLED_ABORT_S = 5.0  # a stalled client's close frame waits this long to be read, then abort


class DirectSendProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol with direct sends (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stall: StallWatch | None = None  # set by `watch_stalls`

    def watch_stalls(self, switch: StallSwitch) -> None:
        """Check whether the client reads, for the session that `switch` installs."""
        self._stall = StallWatch(
            self.loop, switch, self._send_probe, self._reading, self.close_stalled
        )

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._stall is not None:
            self._stall.stop()
            self._stall = None  # it holds this protocol's methods

    def send_text(self, text: str) -> bool:
        """uvicorn's `websocket.send` for a text message, written at once; False when that
        cannot be without waiting: not accepted, closing, or the transport not taking writes
        (uvicorn's send waits for `writable`; so does the caller on False)."""
        if (
            not self.handshake_complete
            or self.close_sent
            or self.disconnected
            or not self.writable.is_set()
            or self.transport.is_closing()
        ):
            return False
        self.conn.send_text(text.encode())
        self.transport.write(b"".join(self.conn.data_to_send()))
        if self._stall is not None:
            self._stall.wrote(len(text))
        return True

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.send" and self._stall is not None:
            self._stall.wrote(len(message.get("bytes") or message.get("text") or ""))

    def handle_ping(self) -> None:
        """A client that pings and reads nothing would have every pong buffered: past the
        transport's high-water mark they are dropped (RFC 6455 5.5.3 lets an endpoint
        answer only the latest ping). While the connection is open the output waiting
        here is pongs only; the keepalive and the stall watch still end such a client."""
        if self.conn.state is State.OPEN and not self.writable.is_set():
            self.conn.data_to_send()
            return
        super().handle_ping()

    def handle_pong(self, event: Any) -> None:
        if self._stall is not None:
            self._stall.heard(bytes(event.data))  # uvicorn's keepalive pong confirms too
        super().handle_pong(event)

    def keepalive_timeout(self) -> None:
        stall = self._stall
        if stall is not None and stall.keepalive_missed():
            # No pong, and output unread: a stalled reader, not a dead keepalive.
            self.pong_timer = None
            self.pending_ping_payload = None
            stall.stalled()
            return
        super().keepalive_timeout()

    def close_stalled(self) -> None:
        """Close with 1008 `client_stalled`: the close frame goes behind what the client has
        not read (a client that reads again sees why), the app hears a disconnect at once,
        and the socket is aborted if the client has not answered the close within
        `STALLED_ABORT_S`."""
        if self._stall is not None:
            self._stall.stop()
        if self.close_sent or self.disconnected or self.transport.is_closing():
            return
        self.stop_keepalive()
        if self.conn.state is State.OPEN:
            self.conn.send_close(CLOSE_POLICY, STALLED)
            self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.queue.put_nowait(
            {"type": "websocket.disconnect", "code": CLOSE_POLICY, "reason": STALLED}
        )
        self.writable.set()  # an app send waiting for the buffer to drain gives up now
        # Not closed yet: a closed socket whose peer's window is shut is soon reset by the
        # kernel, losing the close frame. The client's answering close ends it (uvicorn's
        # handle_close); one that still reads nothing is aborted.
        self.close_timer = self.loop.call_later(STALLED_ABORT_S, self.transport.abort)

    def _reading(self) -> bool:
        return not self.read_paused

    def _send_probe(self, payload: bytes) -> bool:
        if self.close_sent or self.disconnected or self.transport.is_closing():
            return False
        if self.conn.state is not State.OPEN:
            return False
        self.conn.send_ping(payload)
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True

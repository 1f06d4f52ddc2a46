"""Audio frames from the socket's parser straight into the session.

uvicorn hands every WebSocket message to the app through an asyncio queue: a dict per
message, a task wake-up per message, and reading paused and resumed around each one (two
epoll changes). For 50 audio frames a second per stream that was most of the server's cost
per frame. `AudioFastPathProtocol` is uvicorn's websockets-sansio protocol plus one branch:
a whole binary message is offered to the connection's `FastPath` inside `data_received`,
and the session takes it there, synchronously, when nothing has to wait or be reported.

Order with the other messages is kept: the fast path is open only while the connection's
receiver task waits for a message and the queue is empty, so a frame never overtakes a
text message (mark, audio.end) still in the queue or being handled. Everything the fast
path does not take (text, fragments, a frame with an error, a frame over the credit
window, a non-16 kHz stream) goes the ASGI way, handled by the same code as before. Servers
other than ours (another ASGI server, Starlette's TestClient) have no fast path: the
extension is absent and every message takes the queue.

Held until due: the session needs its audio only when a VAD batch is due (64 ms: the
listener is not woken for less), so frames split here are held in the protocol and handed
to the session together once they make up what the session said it can wait for
(`FastPath.hold_samples`): one hand-over (parse, credit check, dedup, one ring write, one
listener poke) per ~3 frames instead of per frame. Anything else that comes in (a text
message, a control frame, a frame the path cannot take) first hands over what is held, so
order is kept; so do the connection's end and the session's (`FastPath.hand_over`).

Framing: websockets' parser (a generator per connection, an event list per read) cost as
much per 20 ms frame as the session's own work. Once a connection is open, without
extensions, and websockets' parser waits at a frame boundary with nothing buffered, this
protocol splits the stream into frames itself: a whole, masked, unfragmented binary frame
within the size limit is unmasked (websockets' C `apply_mask`) and handed on exactly as
websockets would have; every other *whole* frame (text, control, fragments, reserved bits)
is fed to websockets alone, which parses it and is at a frame boundary again after it; and
anything this cannot judge (an unmasked frame, one over the size limit, more than 64 KiB
of an incomplete frame, a closing connection) ends the take-over: that byte and everything
after it go to websockets, which fails the connection its own way.

Stalled readers: while the session runs (`FastPath.on_stall` installed), output written is
followed by pings whose pongs say the client read it (server/ws_stall.py). A client that
reads nothing for `FastPath.stall_s` while output waits is handed to `on_stall` and closed
here with 1008 `client_stalled` (written behind what it has not read; the socket is
aborted if it still reads nothing). The keepalive's own missing pong counts the same while
output waits; without output it stays uvicorn's (1011).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from voxserve.server.ws_stall import ReadProbe

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover (websockets built without its C extension)
    from websockets.utils import apply_mask

log = logging.getLogger(__name__)

FAST_PATH = "voxserve.audio_fast_path"  # key in scope["extensions"]

# The uvicorn methods this subclass extends; checked at import so that a uvicorn that
# changed them runs the plain protocol (slower, same behaviour) instead of breaking.
_HOOKS = (
    "handle_connect",
    "handle_bytes",
    "handle_events",
    "handle_parser_exception",
    "handle_pong",
    "keepalive_timeout",
    "send",
    "stop_keepalive",
)
_FIN_BINARY = 0x82  # first header byte of a whole binary message: FIN, no RSV bits, opcode 2
_MAX_HELD = 64 * 1024  # an incomplete frame waited for here; a longer one goes to websockets
CLOSE_POLICY = 1008
STALLED = "client_stalled"
STALLED_ABORT_S = 5.0  # a stalled client's close frame waits this long to be read, then abort


class FastPath:
    """A connection's switch between the socket and its session. The app installs `sink`
    (takes whole binary messages in order, returns how many it took from the first; the rest
    take the queue) and opens the path while its receiver waits; `direct` and `queued` count
    binary messages by the way they went."""

    __slots__ = (
        "close_stalled",
        "direct",
        "hand_over",
        "hold_samples",
        "on_stall",
        "open",
        "queued",
        "send_text",
        "sent_direct",
        "sink",
        "split",
        "stall_s",
    )

    def __init__(self) -> None:
        self.sink: Callable[[list[bytes]], int] | None = None
        # Samples (message bytes // 2) the protocol may hold before it hands them over: the
        # sink sets it to what the session can wait for; 0 hands every message over at once.
        self.hold_samples = 0
        # Installed by the protocol: hands over what it holds now (the app calls it before
        # it uninstalls the sink).
        self.hand_over: Callable[[], None] | None = None
        self.open = False
        self.direct = 0
        self.queued = 0
        self.split = 0  # binary messages framed by the protocol itself, not by websockets
        # Installed by the protocol: writes a text message at once, False when it cannot
        # (not open, closing, or the transport's buffer is full: the ASGI send waits then).
        self.send_text: Callable[[str], bool] | None = None
        self.sent_direct = 0  # events written by `send_text`
        # Installed by the app while its session runs: called (once) when the client has
        # read nothing for `stall_s` while output waited (module docstring).
        self.on_stall: Callable[[], None] | None = None
        self.stall_s: float | None = None
        # Installed by the protocol: close with 1008 `client_stalled` at once, behind what
        # the client has not read, without waiting for the transport to drain.
        self.close_stalled: Callable[[], None] | None = None


class AudioFastPathProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol with the audio fast path (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fast_path: FastPath | None = None
        self.framing = False  # True: this protocol splits frames (module docstring)
        self._held = b""  # the start of a frame whose rest has not arrived yet
        self._audio: list[bytes] = []  # whole binary messages held for the session
        self._audio_samples = 0  # their size in samples (bytes // 2)
        self._probe: ReadProbe | None = None  # made once output is written in a session

    def data_received(self, data: bytes) -> None:
        if self.framing:
            self._split_frames(data)
            return
        super().data_received(data)
        self.framing = self._at_frame_boundary()

    def connection_lost(self, exc: Exception | None) -> None:
        self._hand_over()  # before the disconnect is queued
        super().connection_lost(exc)
        if self._probe is not None:
            self._probe.stop()
        if self.fast_path is not None:
            # Their bound methods would hold this protocol.
            fast = self.fast_path
            fast.send_text = fast.hand_over = fast.close_stalled = None
        # websockets' parser generator holds its connection: a reference cycle that would
        # keep every closed connection until a full GC pass (soaks with session churn).
        # Closing the generator ends it and frees its frame (nothing is received after this).
        self.conn.parser.close()

    def _at_frame_boundary(self) -> bool:
        """Whether framing can be taken over: an app connection, open, without extensions,
        not inside a fragmented message, and websockets' parser waiting for the next frame
        (suspended in `at_eof`) with nothing buffered."""
        conn = self.conn
        if (
            self.fast_path is None
            or conn.state is not State.OPEN
            or conn.parser_exc is not None
            or conn.extensions
            or conn.current_size is not None
            or conn.reader.buffer
        ):
            return False
        waiting = conn.parser
        while (inner := getattr(waiting, "gi_yieldfrom", None)) is not None:
            waiting = inner
        return getattr(waiting, "__name__", "") == "at_eof"

    def _split_frames(self, data: bytes) -> None:
        if self._held:
            data = self._held + data
            self._held = b""
        conn, fast = self.conn, self.fast_path
        assert fast is not None  # framing is only taken over on an app connection
        if conn.state is not State.OPEN:  # closing (e.g. the server sent a close): websockets'
            self._give_back(data)
            return
        limit = conn.max_message_size
        end = len(data)
        pos = 0
        while end - pos >= 2:
            second = data[pos + 1]
            length = second & 0x7F
            head = pos + 2
            if length == 126:
                if end - head < 2:
                    break
                length = int.from_bytes(data[head : head + 2], "big")
                head += 2
            elif length == 127:
                if end - head < 8:
                    break
                length = int.from_bytes(data[head : head + 8], "big")
                head += 8
            if not second & 0x80 or (limit is not None and length > limit):
                self._give_back(data[pos:])  # unmasked, or too large: websockets fails it
                return
            stop = head + 4 + length
            if stop > end:
                if stop - pos > _MAX_HELD:
                    self._give_back(data[pos:])
                    return
                break
            if data[pos] == _FIN_BINARY and conn.current_size is None:
                payload = apply_mask(data[head + 4 : stop], data[head : head + 4])
                pos = stop
                fast.split += 1
                self._offer(fast, payload, hold=True)
            else:
                self._hand_over()  # what is held goes before this frame
                conn.receive_data(data[pos:stop])  # one whole frame: websockets parses it
                pos = stop
                if conn.parser_exc is not None:
                    self.framing = False
                    self.handle_parser_exception()
                    return
                self.handle_events()
                if conn.state is not State.OPEN:
                    self._give_back(data[pos:])
                    return
        self._held = data[pos:]

    def _give_back(self, rest: bytes) -> None:
        """End the take-over: websockets frames `rest` and everything after it."""
        self._hand_over()
        self.framing = False
        if rest:
            super().data_received(rest)

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:  # the handshake went on to the app
            self.fast_path = FastPath()
            self.fast_path.send_text = self._send_text
            self.fast_path.hand_over = self._hand_over
            self.fast_path.close_stalled = self._close_stalled
            scope["extensions"][FAST_PATH] = self.fast_path

    def _send_text(self, text: str) -> bool:
        """uvicorn's `websocket.send` for a text message without the ASGI message, the
        awaits and Starlette's state checks: for the session's events, one per mark, turn
        and transcript. Only when nothing has to wait: accepted, not closing, the transport
        taking writes (uvicorn's send waits for `writable`; so does the caller on False)."""
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
        self._wrote(len(text))
        return True

    # -- stalled readers (server/ws_stall.py) --------------------------------------------

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.send":
            self._wrote(len(message.get("bytes") or message.get("text") or ""))

    def _wrote(self, size: int) -> None:
        """Output went out: the session's probe pings behind it."""
        probe = self._probe
        if probe is None:
            fast = self.fast_path
            if fast is None or fast.on_stall is None or fast.stall_s is None:
                return
            probe = self._probe = ReadProbe(
                self.loop, fast.stall_s, self._send_probe, self._stalled, self._reading
            )
        probe.wrote(size)

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

    def handle_pong(self, event: Any) -> None:
        if self._probe is not None:
            self._probe.heard(bytes(event.data))  # uvicorn's keepalive pong confirms too
        super().handle_pong(event)

    def keepalive_timeout(self) -> None:
        probe, fast = self._probe, self.fast_path
        in_session = fast is not None and fast.on_stall is not None
        if probe is not None and probe.waiting and not probe.stopped and in_session:
            # No pong, and output unread: a stalled reader, not a dead keepalive.
            self.pong_timer = None
            self.pending_ping_payload = None
            probe.stop()
            self._stalled()
            return
        super().keepalive_timeout()

    def _stalled(self) -> None:
        """The client read nothing for the stall time while output waited: the app ends the
        session (`on_stall`), and the connection closes now."""
        fast = self.fast_path
        on_stall = fast.on_stall if fast is not None else None
        if on_stall is None:
            return  # the session is over already
        fast.on_stall = None  # type: ignore[union-attr]
        on_stall()
        self._close_stalled()

    def _close_stalled(self) -> None:
        """Close with 1008 `client_stalled`: the close frame goes behind what the client has
        not read (a client that reads again sees why), the app hears a disconnect at once,
        and the socket is aborted if the client has not answered the close within
        `STALLED_ABORT_S`."""
        if self._probe is not None:
            self._probe.stop()
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

    def handle_bytes(self, event: Any) -> None:
        fast = self.fast_path
        if fast is None:
            super().handle_bytes(event)
        elif event.fin:
            self._offer(fast, event.data, hold=False)
        else:
            self._hand_over()
            self._to_queue(fast, event)

    def _offer(self, fast: FastPath, data: bytes, *, hold: bool) -> None:
        """A whole binary message: held for the session (`hold`, while under what it can
        wait for), handed to it with what is held, or queued when the path is not open or
        something queued is ahead of it."""
        if fast.sink is None or not fast.open or self.close_sent or not self.queue.empty():
            self._hand_over()
            self._to_queue(fast, Frame(Opcode.BINARY, data))
            return
        self._audio.append(data)
        self._audio_samples += len(data) >> 1
        if not hold or self._audio_samples >= fast.hold_samples:
            self._hand_over()

    def _hand_over(self) -> None:
        """Give the session what is held; what it does not take goes the queued way, in
        order (nothing else has been queued since the first of them was held)."""
        held, fast = self._audio, self.fast_path
        if not held or fast is None:
            return
        self._audio = []
        self._audio_samples = 0
        taken = 0
        sink = fast.sink
        if sink is not None:
            try:
                taken = sink(held)
            except Exception:
                # A bug here must not cost the connection (an exception in data_received
                # closes it): this stream goes the queued way from now on.
                log.exception("audio fast path failed; this stream's audio takes the queue")
                fast.sink = _refuse
                taken = 0
        fast.direct += taken
        for data in held[taken:]:
            self._to_queue(fast, Frame(Opcode.BINARY, data))

    def _to_queue(self, fast: FastPath, event: Any) -> None:
        """The ASGI way (counted as queued once the session's sink is installed)."""
        if fast.sink is not None:
            fast.queued += 1
        super().handle_bytes(event)


def _refuse(messages: list[bytes]) -> int:
    """The sink of a connection whose fast path failed: every message takes the queue."""
    return 0


def websocket_protocol() -> type[WebSocketsSansIOProtocol] | str:
    """The protocol class for uvicorn's `ws` setting."""
    if all(hasattr(WebSocketsSansIOProtocol, name) for name in _HOOKS):
        return AudioFastPathProtocol
    log.warning("this uvicorn's websockets protocol changed; audio takes the ASGI queue")
    return "websockets-sansio"


def fast_path_of(scope: Mapping[str, Any]) -> FastPath | None:
    """The connection's fast path, or None where the server has none."""
    extensions = scope.get("extensions") or {}
    fast = extensions.get(FAST_PATH)
    return fast if isinstance(fast, FastPath) else None

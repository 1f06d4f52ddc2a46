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

Audio as text (/v1/realtime's `input_audio_buffer.append`, base64 in JSON): a route that
installs `FastPath.holds_text` has its whole text messages that it names audio held the same
way, while its receiver waits, and queued together at the hand-over: the JSON and base64 are
still decoded by the receiver, but it wakes (and reading pauses and resumes) once a VAD
batch, not once a message.

A connection's turn: a read (up to 256 KB) may hold tens of thousands of tiny frames (empty
pings, pongs, empty binary messages), each a few microseconds of Python: handled at once, one
read held the loop for a third of a second, and every other stream with it. So a read is
handled for at most a turn (server/session/loop_share.py: 4 ms); what is left waits for the
loop's next turn with the socket's reading paused, and the other connections' frames are
served in between. A client's close is read only after its backlog is handled; a connection
reset meanwhile loses what was not framed yet, as it would in the kernel's buffer (no answer
could reach it).

Framing: while websockets' parser waits at a frame boundary, server/websocket/frames.py's
`FrameSplitter` splits the stream instead: its binary messages are offered here as
websockets' would have been, every other frame is fed to websockets alone, and what it
cannot judge (or a closing connection) goes to websockets with all that follows, until its
parser waits at a boundary again. Output that skips the ASGI send and the stalled-reader
check are server/websocket/send.py's, which this protocol extends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, State

from voxserve.server.session.loop_share import turn_ends
from voxserve.server.websocket.frames import FIN_TEXT, FrameSplitter, at_frame_boundary, payload_of
from voxserve.server.websocket.send import DirectSendProtocol

log = logging.getLogger(__name__)

# A 256 KB read of tiny frames (empty pings: ~43,000, ~0.35 s to handle here) is handled a
# turn (server/session/loop_share.py) at a time, reading paused in between, so the other
# connections' frames are served between its turns.
READ_SLICE = 4096  # bytes given to websockets' parser at a time: at most ~680 frames
MESSAGES_PER_SPLIT = 64  # binary messages split before the clock is looked at again

FAST_PATH = "voxserve.audio_fast_path"  # key in scope["extensions"]

# What this protocol and server/websocket/send.py extend and read of uvicorn's, and what
# server/websocket/frames.py reads of websockets' parser, checked when the protocol is chosen so
# that a uvicorn or websockets that changed them runs the plain protocol (slower, same
# behaviour) instead of breaking. All of it is there from uvicorn 0.52.1 and websockets 16.0
# on (pyproject.toml says which versions this is tested with, and why).
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
_STATE = (
    "close_sent",
    "close_timer",
    "disconnected",
    "handshake_complete",
    "pending_ping_payload",
    "pong_timer",
    "queue",
    "read_paused",
    "writable",
)
_WEBSOCKETS_STATE = ("current_size", "extensions", "max_message_size", "parser", "parser_exc")


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
        "hold_text",
        "holds_text",
        "on_stall",
        "open",
        "queued",
        "send_text",
        "sent_direct",
        "set_max_size",
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
        # read nothing for `stall_s` while output waited (server/websocket/send.py).
        self.on_stall: Callable[[], None] | None = None
        self.stall_s: float | None = None
        # Installed by the protocol: close with 1008 `client_stalled` at once, behind what
        # the client has not read, without waiting for the transport to drain.
        self.close_stalled: Callable[[], None] | None = None
        # Installed by the protocol: the connection's message size limit, raised by a route
        # that refuses oversized messages itself (server/realtime/stream.py).
        self.set_max_size: Callable[[int], None] | None = None
        # Installed by a route that sends audio as text (server/realtime/stream.py): whole text
        # messages it says are audio are held, like binary audio, while the path is open and
        # their payloads total under `hold_text` bytes, then queued together (the receiver
        # wakes once for them, not once each). 0 queues every text message at once.
        self.holds_text: Callable[[bytes], bool] | None = None
        self.hold_text = 0


class AudioFastPathProtocol(DirectSendProtocol):
    """uvicorn's websockets-sansio protocol with the audio fast path (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fast_path: FastPath | None = None
        self.framing = False  # True: `_splitter` splits the frames (module docstring)
        self._splitter: FrameSplitter | None = None  # an app connection's, once accepted
        self._audio: list[bytes] = []  # whole binary messages held for the session
        self._audio_samples = 0  # their size in samples (bytes // 2)
        self._texts: list[bytes] = []  # whole text messages held (FastPath.holds_text)
        self._text_bytes = 0
        self._backlog = b""  # read, not yet framed: waits for `_next_turn`
        self._next_turn: asyncio.Handle | None = None

    def data_received(self, data: bytes) -> None:
        if self._next_turn is not None:  # a turn is owed: this waits behind it, in order
            self._backlog += data
            self.transport.pause_reading()  # uvicorn may have resumed it (its queue drained)
            return
        self._take(data, turn_ends())

    def _take(self, data: bytes, deadline: float) -> None:
        """Frame and handle `data` until `deadline`; what is left waits for the next turn
        of the loop, reading paused (module docstring: "A connection's turn")."""
        while True:
            if self.framing:
                rest = self._split(data, deadline)
                if rest is None:  # out of time: the splitter holds the rest
                    self._defer()
                    return
                data = rest  # for websockets' parser (it gave up), or nothing
            while data and not self.framing:
                piece, data = data[:READ_SLICE], data[READ_SLICE:]
                super().data_received(piece)
                self.framing = self.fast_path is not None and at_frame_boundary(self.conn)
                if data and time.perf_counter() >= deadline:
                    self._defer(data)
                    return
            if not data:
                return

    def _defer(self, rest: bytes = b"") -> None:
        """Owe a turn: `rest` (read, not framed; the backlog is empty while no turn is
        owed) and what the splitter holds wait for it, reading paused."""
        self._backlog = rest
        self.transport.pause_reading()
        self._next_turn = self.loop.call_soon(self._turn)

    def _turn(self) -> None:
        """The next turn of a connection that ran out of time: what it left, then reading
        again (unless uvicorn holds it paused: its queue is full)."""
        self._next_turn = None
        data, self._backlog = self._backlog, b""
        self._take(data, turn_ends())
        if self._next_turn is None and not self.read_paused:
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._next_turn is not None:
            # Lost while reading was paused, so by a reset or an abort (a close is read only
            # once the backlog is handled): no answer can reach the client; what it sent and
            # was not framed yet goes as it would have in the kernel's buffer.
            self._next_turn.cancel()
            self._next_turn = None
            self._backlog = b""
        self._hand_over()  # before the disconnect is queued
        super().connection_lost(exc)
        if self.fast_path is not None:
            # Their bound methods would hold this protocol.
            fast = self.fast_path
            fast.send_text = fast.hand_over = fast.close_stalled = fast.set_max_size = None
            self._splitter = None
        # websockets' parser generator holds its connection: a reference cycle that would
        # keep every closed connection until a full GC pass (soaks with session churn).
        # Closing the generator ends it and frees its frame (nothing is received after this).
        self.conn.parser.close()

    def _split(self, data: bytes, deadline: float) -> bytes | None:
        """A read while this protocol splits the frames (module docstring): what websockets'
        parser takes next once the splitter gives up (b"": nothing), or None when
        `deadline` passed with whole frames still held."""
        conn, splitter = self.conn, self._splitter
        assert splitter is not None  # framing is only taken over on an app connection
        if conn.state is not State.OPEN:  # closing (e.g. the server sent a close): websockets'
            return self._give_back(splitter.give_up(data))
        while (frame := splitter.split(data, MESSAGES_PER_SPLIT)) is not None:
            data = b""
            if frame and not (frame[0] == FIN_TEXT and self._hold_text(frame)):
                self._hand_over()  # what is held goes before this frame
                conn.receive_data(frame)  # one whole frame: websockets parses it
                if conn.parser_exc is not None:
                    self.framing = False
                    splitter.give_up()  # websockets discards what follows its error
                    self.handle_parser_exception()
                    return b""
                self.handle_events()
                if conn.state is not State.OPEN:
                    return self._give_back(splitter.give_up())
            if splitter.held and time.perf_counter() >= deadline:
                return None
        if splitter.rest is not None:  # unmasked, too large, or too long to wait for
            return self._give_back(splitter.rest)
        return b""

    def _give_back(self, rest: bytes) -> bytes:
        """End the take-over: `rest` and everything after it are websockets' to frame (the
        caller feeds them to it)."""
        self._hand_over()
        self.framing = False
        return rest

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:  # the handshake went on to the app
            fast = self.fast_path = FastPath()
            fast.send_text, fast.close_stalled = self.send_text, self.close_stalled
            fast.hand_over = self._hand_over
            fast.set_max_size = self._set_max_size
            self._splitter = FrameSplitter(self._offer, self.conn.max_message_size)
            self.watch_stalls(fast)
            scope["extensions"][FAST_PATH] = fast

    def _set_max_size(self, size: int) -> None:
        self.conn.max_message_size = size
        if self._splitter is not None:
            self._splitter.max_size = size

    def handle_bytes(self, event: Any) -> None:
        fast = self.fast_path
        if fast is None:
            super().handle_bytes(event)
        elif event.fin:
            self._offer(event.data, split=False)
        else:
            self._hand_over()
            self._to_queue(fast, event)

    def _offer(self, data: bytes, split: bool = True) -> None:
        """A whole binary message, split here (the splitter's `on_message`: held while under
        what the session can wait for) or by websockets (handed over with what is held), or
        queued when the path is not open or something queued is ahead of it."""
        fast = self.fast_path
        assert fast is not None  # on an app connection only
        if split:
            fast.split += 1
        if fast.sink is None or not fast.open or self.close_sent or not self.queue.empty():
            self._hand_over()
            self._to_queue(fast, Frame(Opcode.BINARY, data))
            return
        self._audio.append(data)
        self._audio_samples += len(data) >> 1
        if not split or self._audio_samples >= fast.hold_samples:
            self._hand_over()

    def _hold_text(self, frame: bytes) -> bool:
        """Hold a whole masked text frame the route says is audio (FastPath.holds_text), as
        `_offer` holds binary audio; False: websockets takes it, after what is held."""
        fast = self.fast_path
        if (
            fast is None
            or fast.holds_text is None
            or not fast.open
            or self.close_sent
            or not self.queue.empty()
            or self.conn.current_size is not None  # inside a fragmented message
            or self._audio
        ):
            return False
        payload = payload_of(frame)
        if not fast.holds_text(payload):
            return False
        self._texts.append(payload)
        self._text_bytes += len(payload)
        if self._text_bytes >= fast.hold_text:
            self._hand_over()
        return True

    def _hand_over(self) -> None:
        """Give the session what is held; what it does not take goes the queued way, in
        order (nothing else has been queued since the first of them was held)."""
        if self._texts:  # queued together: one wake-up of the receiver for all
            texts, self._texts, self._text_bytes = self._texts, [], 0
            for text in texts:
                super().handle_text(Frame(Opcode.TEXT, text))
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
    uvicorn_state = WebSocketsSansIOProtocol.__init__.__code__.co_names  # attributes it sets
    websockets_state = Protocol.__init__.__code__.co_names
    if (
        all(hasattr(WebSocketsSansIOProtocol, name) for name in _HOOKS)
        and all(name in uvicorn_state for name in _STATE)
        and all(name in websockets_state for name in _WEBSOCKETS_STATE)
    ):
        return AudioFastPathProtocol
    log.warning("uvicorn's or websockets' protocol changed; audio takes the ASGI queue")
    return "websockets-sansio"


def fast_path_of(scope: Mapping[str, Any]) -> FastPath | None:
    """The connection's fast path, or None where the server has none."""
    extensions = scope.get("extensions") or {}
    fast = extensions.get(FAST_PATH)
    return fast if isinstance(fast, FastPath) else None

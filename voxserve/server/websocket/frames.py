"""A client's WebSocket byte stream split into frames without websockets' parser (sans-I/O).

websockets' parser (a generator per connection, an event list per read) cost as much per
20 ms audio frame as the session's own work. `FrameSplitter` does only what audio needs:
bytes in as they come off the socket; out, the whole binary messages at their front,
unmasked, exactly as websockets would have returned them. It stops at every other whole
frame (text, control, fragments, reserved bits) and hands it back as it came, for
websockets to parse; and it gives up on anything it cannot judge (an unmasked frame, one
over the message size limit, more than `max_held` bytes of an incomplete frame): that
byte and everything after it go to websockets, which parses them or fails the connection
its own way.

It does no I/O and knows nothing of uvicorn (server/websocket/fastpath.py feeds it). It may start
only where websockets' parser waits at a frame boundary (`at_frame_boundary`), so the two
never hold parts of one frame, and it follows fragmented messages as websockets does: a
binary frame inside one is websockets' to refuse.
"""

from __future__ import annotations

from collections.abc import Callable

from websockets.protocol import Protocol, State

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover (websockets built without its C extension)
    from websockets.utils import apply_mask

FIN_BINARY = 0x82  # first header byte of a whole binary message: FIN, no RSV bits, opcode 2
FIN_TEXT = 0x81  # a whole text message (server/websocket/fastpath.py holds Realtime's audio ones)


def payload_of(frame: bytes) -> bytes:
    """The unmasked payload of one whole masked frame, as `FrameSplitter.split` returns it."""
    length, head = frame[1] & 0x7F, 2
    if length == 126:
        head = 4
    elif length == 127:
        head = 10
    return apply_mask(frame[head + 4 :], frame[head : head + 4])


MAX_HELD = 64 * 1024  # an incomplete frame waited for here; a longer one goes to websockets
_CONT, _TEXT, _BINARY = 0x0, 0x1, 0x2


class FrameSplitter:
    """Splits a client's frames (module docstring). Each whole binary message goes to
    `on_message` as it is found (a callback, not a list: nothing allocated per read on the
    audio path; it must not call the splitter); `split` returns every other whole frame,
    for websockets to parse."""

    __slots__ = ("_buf", "_fragmented", "_pos", "max_held", "max_size", "on_message", "rest")

    def __init__(
        self,
        on_message: Callable[[bytes], None],
        max_size: int | None,
        max_held: int = MAX_HELD,
    ) -> None:
        self.on_message = on_message
        self.max_size = max_size  # websockets' message size limit (its max_message_size)
        self.max_held = max_held
        self._buf = b""  # bytes not split yet, from `_pos` on
        self._pos = 0
        self._fragmented = False  # inside a fragmented message (websockets' current_size)
        self.rest: bytes | None = None

    def split(self, data: bytes, max_messages: int = 0) -> bytes | None:
        """Split what is held and `data`: whole binary messages, unmasked, to `on_message`
        in order, up to the first other frame, which is returned whole for websockets to
        parse next (then call `split(b"")` for what follows it); or b"" after `max_messages`
        of them (if not 0: the caller looks at its clock, then calls `split(b"")` for the
        rest, as after a frame). None: everything is split but the start of a frame, held
        for the next read; or, when `rest` is set, the splitter gave up: websockets takes
        `rest` and everything after it, and the splitter is empty, ready for the next
        take-over."""
        buf, pos = self._buf, self._pos
        if data:
            buf = buf[pos:] + data if buf else data
            pos = 0
        self.rest = None
        on_message = self.on_message
        limit = self.max_size
        end = len(buf)
        messages = 0
        while end - pos >= 2:
            second = buf[pos + 1]
            length = second & 0x7F
            head = pos + 2
            if length == 126:
                if end - head < 2:
                    break
                length = (buf[head] << 8) | buf[head + 1]
                head = pos + 4
            elif length == 127:
                if end - head < 8:
                    break
                length = int.from_bytes(buf[head : head + 8], "big")
                head = pos + 10
            if not second & 0x80 or (limit is not None and length > limit):
                self._end(buf[pos:])  # unmasked, or too large: websockets fails it
                return None
            stop = head + 4 + length
            if stop > end:
                if stop - pos > self.max_held:
                    self._end(buf[pos:])
                    return None
                break
            first = buf[pos]
            if first == FIN_BINARY and not self._fragmented:
                pos = stop
                on_message(apply_mask(buf[head + 4 : stop], buf[head : head + 4]))
                messages += 1
                if messages == max_messages:
                    self._buf, self._pos = buf, pos
                    return b""
                continue
            opcode = first & 0x0F
            if opcode == _TEXT or opcode == _BINARY:
                self._fragmented = not first & 0x80
            elif opcode == _CONT and first & 0x80:
                self._fragmented = False
            self._buf, self._pos = buf, stop
            return buf[pos:stop]
        self._buf, self._pos = buf[pos:], 0  # the start of a frame, held for the next read
        return None

    @property
    def held(self) -> bool:
        """Whether bytes are held (whole frames, or the start of one)."""
        return len(self._buf) > self._pos

    def give_up(self, data: bytes = b"") -> bytes:
        """End the take-over: what is held and `data`, for websockets to take."""
        rest = self._buf[self._pos :] + data if self._buf else data
        self._buf, self._pos, self._fragmented = b"", 0, False
        return rest

    def _end(self, rest: bytes) -> None:
        self.rest = rest
        self._buf, self._pos, self._fragmented = b"", 0, False


def at_frame_boundary(conn: Protocol) -> bool:
    """Whether a `FrameSplitter` may take over from websockets' parser: the connection open,
    without extensions, not inside a fragmented message, and the parser waiting for the
    next frame (suspended in `at_eof`) with nothing buffered."""
    if (
        conn.state is not State.OPEN
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

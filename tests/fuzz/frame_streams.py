"""Client WebSocket byte streams for the fast path's frame splitter
(server/websocket/frames.py), and the two ways to read them that must agree: websockets
alone, and `SplitReader`, which does
what server/websocket/fastpath.py does with each read (the splitter while websockets waits at a
frame boundary, every other frame and everything the splitter gives up on to websockets),
without uvicorn or a socket.

`encode` writes any header a client could send: masked or not, the length in 7, 16 or 64
bits (minimal or not), reserved bits, any opcode, a declared length the payload does not
have. `valid_streams` are what a well-behaved client sends (audio, text, pings and pongs,
fragmented messages with control frames between their fragments, a close at the end);
`hostile_streams` mix in everything else.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import strategies as st
from websockets.frames import Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.utils import apply_mask

from voxserve.server.websocket.frames import FrameSplitter, at_frame_boundary

MAX_SIZE = 1000  # the message size limit the fuzz tests run with (uvicorn's ws_max_size)
MAX_HELD = 200  # a small held limit, so that waiting for a long frame gives up often
FIN = 0x80
MASK = b"\x1f\x8b\x00\xa5"

ReceivedFrame = tuple[Opcode, bool, bytes]  # opcode, fin, payload
HOSTILE = [
    *("unmasked", "oversize", "too_long_64", "rsv", "opcode", "lone_cont", "control"),
    *("open_fragment", "garbage", "half", "long_wait"),
]


def encode(
    first: int,
    payload: bytes,
    *,
    mask: bytes | None = MASK,
    width: int | None = None,
    declared: int | None = None,
) -> bytes:
    """One frame as raw bytes: `first` is the first header byte (FIN, RSV, opcode); the
    length is `declared` (default the payload's) in `width` bits (7, 16 or 64; default the
    smallest that holds it)."""
    length = len(payload) if declared is None else declared
    if width is None:
        width = 7 if length < 126 else 16 if length < 1 << 16 else 64
    masked = 0x80 if mask is not None else 0
    if width == 7:
        head = bytes([first, masked | length])
    elif width == 16:
        head = bytes([first, masked | 126]) + length.to_bytes(2, "big")
    else:
        head = bytes([first, masked | 127]) + length.to_bytes(8, "big")
    if mask is None:
        return head + payload
    return head + mask + apply_mask(payload, mask)


@dataclass(frozen=True)
class Sent:
    """One frame on the wire, what websockets reads from it, and whether the splitter takes
    it as an audio message (a whole binary message) or returns it for websockets."""

    wire: bytes
    frame: ReceivedFrame
    message: bool = False


@dataclass(frozen=True)
class Stream:
    """A client's frames and where TCP cut their bytes."""

    sent: list[Sent]
    cuts: list[int]

    @property
    def data(self) -> bytes:
        return b"".join(s.wire for s in self.sent)

    def reads(self) -> list[bytes]:
        data = self.data
        points = [0, *sorted({min(cut, len(data)) for cut in self.cuts}), len(data)]
        return [data[a:b] for a, b in itertools.pairwise(points) if b > a]

    @property
    def frames(self) -> list[ReceivedFrame]:
        return [s.frame for s in self.sent]


payloads = st.binary(max_size=300)
parts = st.binary(max_size=200)  # a fragmented message's parts: under MAX_SIZE together
widths = st.sampled_from([None, None, None, 16, 64])  # mostly minimal
masks = st.binary(min_size=4, max_size=4)


@st.composite
def message(draw: st.DrawFn) -> list[Sent]:
    """One message as a client sends it."""
    kind = draw(st.sampled_from(["audio", "audio", "audio", "text", "ping", "pong", "parts"]))
    if kind in ("audio", "text"):
        opcode = Opcode.BINARY if kind == "audio" else Opcode.TEXT
        payload = draw(payloads if kind == "audio" else st.text(max_size=80).map(str.encode))
        wire = encode(FIN | opcode, payload, mask=draw(masks), width=draw(widths))
        return [Sent(wire, (opcode, True, payload), message=kind == "audio")]
    if kind in ("ping", "pong"):
        opcode = Opcode.PING if kind == "ping" else Opcode.PONG
        payload = draw(st.binary(max_size=125))
        return [Sent(encode(FIN | opcode, payload, mask=draw(masks)), (opcode, True, payload))]
    # A fragmented binary message, with control frames between its fragments.
    sent = []
    fragments = draw(st.lists(parts, min_size=2, max_size=4))
    for i, part in enumerate(fragments):
        last = i == len(fragments) - 1
        opcode = Opcode.BINARY if i == 0 else Opcode.CONT
        wire = encode((FIN if last else 0) | opcode, part, mask=draw(masks), width=draw(widths))
        sent.append(Sent(wire, (opcode, last, part)))
        if not last and draw(st.booleans()):
            ping = draw(st.binary(max_size=20))
            wire = encode(FIN | Opcode.PING, ping, mask=draw(masks))
            sent.append(Sent(wire, (Opcode.PING, True, ping)))
    return sent


def cuts_of(sent: list[Sent]) -> st.SearchStrategy[list[int]]:
    size = sum(len(s.wire) for s in sent)
    return st.lists(st.integers(0, size), max_size=20)


@st.composite
def valid_streams(draw: st.DrawFn) -> Stream:
    sent = [s for m in draw(st.lists(message(), max_size=12)) for s in m]
    if draw(st.booleans()):
        close = (1000).to_bytes(2, "big") + b"bye"
        sent.append(Sent(encode(FIN | Opcode.CLOSE, close), (Opcode.CLOSE, True, close)))
    return Stream(sent, draw(cuts_of(sent)))


@st.composite
def hostile_frame(draw: st.DrawFn) -> list[Sent]:
    """A frame a server must refuse, or one that is odd but valid."""
    wire = draw(hostile_bytes())
    return [Sent(wire, (Opcode.CLOSE, True, b""))]  # what websockets reads: not known here


@st.composite
def hostile_bytes(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(HOSTILE))
    payload = draw(st.binary(max_size=40))
    if kind == "unmasked":
        return encode(FIN | Opcode.BINARY, payload, mask=None, width=draw(widths))
    if kind == "oversize":  # declared over the limit, the payload never sent
        return encode(FIN | Opcode.BINARY, b"", declared=draw(st.integers(MAX_SIZE + 1, 70_000)))
    if kind == "too_long_64":  # the 64-bit length's top bit set
        return encode(FIN | Opcode.BINARY, b"", width=64, declared=(1 << 63) + len(payload))
    if kind == "rsv":
        return encode(draw(st.sampled_from([0x40, 0x20, 0x10])) | FIN | Opcode.BINARY, payload)
    if kind == "opcode":
        return encode(FIN | draw(st.sampled_from([3, 4, 5, 6, 7, 0xB, 0xC, 0xF])), payload)
    if kind == "open_fragment":  # a binary message's first part: whole ones inside it are errors
        return encode(Opcode.BINARY, payload)
    if kind == "lone_cont":
        return encode(draw(st.sampled_from([0, FIN])) | Opcode.CONT, payload)
    if kind == "control":  # fragmented or too long control frames
        opcode = draw(st.sampled_from([Opcode.PING, Opcode.PONG, Opcode.CLOSE]))
        return encode((FIN if draw(st.booleans()) else 0) | opcode, payload * 4)
    if kind == "half":  # a binary frame that starts and never ends (within this stream)
        whole = encode(FIN | Opcode.BINARY, payload + b"x")
        return whole[: draw(st.integers(1, len(whole) - 1))]
    if kind == "long_wait":  # valid, but longer than the splitter waits for
        return encode(FIN | Opcode.BINARY, draw(st.binary(min_size=MAX_HELD, max_size=600)))
    return draw(st.binary(min_size=1, max_size=12))


@st.composite
def hostile_streams(draw: st.DrawFn) -> Stream:
    """Valid messages and hostile frames mixed (only the bytes count: `frames` is not what
    websockets reads from them)."""
    pieces = draw(st.lists(message() | hostile_frame(), min_size=1, max_size=10))
    sent = [s for piece in pieces for s in piece]
    return Stream(sent, draw(cuts_of(sent)))


def received(conn: ServerProtocol) -> list[ReceivedFrame]:
    return [(f.opcode, f.fin, bytes(f.data)) for f in conn.events_received()]


def close_code(conn: ServerProtocol) -> int | None:
    return conn.close_sent.code if conn.close_sent is not None else None


def websockets_alone(reads: list[bytes]) -> tuple[list[ReceivedFrame], int | None]:
    """What websockets reads from `reads`, and the close code it sends (None: none)."""
    conn = ServerProtocol(state=State.OPEN, max_size=MAX_SIZE)
    frames: list[ReceivedFrame] = []
    for data in reads:
        conn.receive_data(data)
        frames += received(conn)
    return frames, close_code(conn)


class SplitReader:
    """server/websocket/fastpath.py's reading, without uvicorn: each read goes to the splitter while
    it has taken over, else to websockets, and the take-over starts whenever websockets
    waits at a frame boundary after a read. `split` counts the messages the splitter took."""

    def __init__(self, max_held: int = MAX_HELD) -> None:
        self.conn = ServerProtocol(state=State.OPEN, max_size=MAX_SIZE)
        self.splitter = FrameSplitter(self._message, MAX_SIZE, max_held)
        self.frames: list[ReceivedFrame] = []
        self.split = 0
        self.framing = at_frame_boundary(self.conn)
        self.failed = False  # websockets failed the connection: uvicorn reads no more

    def _message(self, payload: bytes) -> None:
        self.split += 1
        self.frames.append((Opcode.BINARY, True, payload))

    def read(self, data: bytes) -> None:
        if self.failed:
            return
        if not self.framing:
            self._to_websockets(data)
            self.framing = not self.failed and at_frame_boundary(self.conn)
            return
        splitter, conn = self.splitter, self.conn
        if conn.state is not State.OPEN:
            self._give_back(splitter.give_up(data))
            return
        while (frame := splitter.split(data)) is not None:
            self._to_websockets(frame)
            if self.failed:
                self.framing = False
                splitter.give_up()
                return
            if conn.state is not State.OPEN:
                self._give_back(splitter.give_up())
                return
            data = b""
        if splitter.rest is not None:
            self._give_back(splitter.rest)

    def end(self) -> tuple[list[ReceivedFrame], int | None]:
        """The frames and the close code once the stream has ended: a frame the splitter
        still waits for is websockets' to judge, as it would have been without it."""
        if self.framing:
            self._give_back(self.splitter.give_up())
        return self.frames, close_code(self.conn)

    def _give_back(self, rest: bytes) -> None:
        self.framing = False
        if rest:
            self._to_websockets(rest)

    def _to_websockets(self, data: bytes) -> None:
        self.conn.receive_data(data)
        self.frames += received(self.conn)
        self.failed = self.conn.parser_exc is not None


def split_reading(
    reads: list[bytes], max_held: int = MAX_HELD
) -> tuple[list[ReceivedFrame], int | None, int]:
    """What `SplitReader` reads from `reads`, the close code, and how many it split."""
    reader = SplitReader(max_held)
    for data in reads:
        reader.read(data)
    frames, code = reader.end()
    return frames, code, reader.split

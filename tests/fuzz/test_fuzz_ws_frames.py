"""The fast path's frame splitter (server/websocket/frames.py) on generated client streams
cut by TCP anywhere: alone, it returns each whole binary message unmasked and every other
frame as it
came, whatever the cuts; reading as server/websocket/fastpath.py does (the splitter, websockets
for the rest) gives exactly what websockets alone reads, valid streams and hostile ones
alike: the same frames, the same close code. Streams are in tests/fuzz/frame_streams.py."""

from __future__ import annotations

from hypothesis import example, given
from websockets.frames import Opcode

from tests.fuzz.frame_streams import (
    FIN,
    MAX_SIZE,
    Sent,
    Stream,
    encode,
    hostile_streams,
    split_reading,
    valid_streams,
    websockets_alone,
)
from voxserve.server.websocket.frames import FrameSplitter


def _audio(payload: bytes, **kwargs: object) -> Sent:
    wire = encode(FIN | Opcode.BINARY, payload, **kwargs)  # type: ignore[arg-type]
    return Sent(wire, (Opcode.BINARY, True, payload), message=True)


def _raw(data: bytes) -> Stream:
    """A hostile stream from its bytes (only the bytes count)."""
    return Stream([Sent(data, (Opcode.CLOSE, True, b""))], [])


@given(valid_streams())
@example(Stream([_audio(b"x" * 300, width=64), _audio(b"")], cuts=[1, 2, 3, 9, 10, 11]))
def test_a_valid_stream_gives_the_same_frames_wherever_it_is_cut(stream: Stream) -> None:
    """The splitter alone returns each whole binary message unmasked and every other frame
    as it came; read as the server reads, the stream gives the frames the client sent and
    what websockets alone reads, every whole binary message split here."""
    out: list[tuple[str, bytes]] = []
    splitter = FrameSplitter(lambda payload: out.append(("message", payload)), MAX_SIZE)
    reads = stream.reads()
    for data in reads:
        while (frame := splitter.split(data)) is not None:
            out.append(("frame", frame))
            data = b""
        assert splitter.rest is None  # a valid stream is never given up on
    assert splitter.give_up() == b""  # nothing left over
    assert out == [("message", s.frame[2]) if s.message else ("frame", s.wire) for s in stream.sent]

    frames, code, split = split_reading(reads, max_held=64 * 1024)
    closed = bool(stream.sent) and stream.frames[-1][0] is Opcode.CLOSE
    assert frames == stream.frames
    assert code == (1000 if closed else None)
    assert split == sum(s.message for s in stream.sent)
    assert (frames, code) == websockets_alone(reads)


@given(hostile_streams())
@example(_raw(encode(FIN | Opcode.BINARY, b"a", mask=None)))  # unmasked: 1002
@example(_raw(encode(FIN | Opcode.BINARY, b"", declared=MAX_SIZE + 1)))  # too large: 1009
@example(_raw(encode(FIN | Opcode.BINARY, b"", width=64, declared=1 << 63)))  # 64-bit top bit
@example(_raw(encode(Opcode.BINARY, b"a") + encode(FIN | Opcode.BINARY, b"b")))  # inside one
@example(_raw(encode(Opcode.BINARY, b"a") + encode(Opcode.CONT, b"b") + encode(0x82, b"c")))
@example(_raw(encode(FIN | 0x40 | Opcode.BINARY, b"rsv")))
@example(_raw(encode(FIN | 0x3, b"opcode 3")))
@example(_raw(b"\x82\xfe\x00"))  # a 16-bit length cut short, at the end
def test_any_stream_reads_the_same_split_here_as_by_websockets(stream: Stream) -> None:
    """Whatever comes, frames and the close code are websockets' own: what the splitter
    cannot judge it hands back, and websockets fails the connection as it would have."""
    reads = stream.reads()
    frames, code, _ = split_reading(reads)
    assert (frames, code) == websockets_alone(reads)

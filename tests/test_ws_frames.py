"""The fast path's frame splitter (server/websocket/frames.py) by example, without a socket: each
length encoding, the size and wait limits at their edges, frames it returns for websockets
(text, control, fragments) and what it gives up on, and when it may take over from
websockets' parser. tests/fuzz/test_fuzz_ws_frames.py checks the same on generated streams
against websockets itself."""

from __future__ import annotations

import pytest
from websockets.frames import Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

from tests.fuzz.frame_streams import FIN, encode
from voxserve.server.websocket.frames import FrameSplitter, at_frame_boundary

AUDIO = FIN | Opcode.BINARY


class Splitter:
    """A splitter and what came out of it, in order."""

    def __init__(self, max_size: int | None = 1000, max_held: int = 200) -> None:
        self.out: list[tuple[str, bytes]] = []
        self.splitter = FrameSplitter(self._message, max_size, max_held)

    def _message(self, payload: bytes) -> None:
        self.out.append(("message", payload))

    def read(self, data: bytes) -> bytes | None:
        """Feed one read; every frame returned is recorded; the splitter's `rest`."""
        while (frame := self.splitter.split(data)) is not None:
            self.out.append(("frame", frame))
            data = b""
        return self.splitter.rest


@pytest.mark.parametrize(
    ("size", "width"),
    [(0, None), (125, None), (126, None), (65_535, None), (65_536, None), (5, 16), (5, 64)],
    ids=["empty", "7-bit", "16-bit", "16-bit-max", "64-bit", "5-in-16", "5-in-64"],
)
def test_every_length_encoding_gives_the_message_unmasked(size: int, width: int | None) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    s = Splitter(max_size=None, max_held=1 << 20)
    wire = encode(AUDIO, payload, width=width)
    assert s.read(wire[: len(wire) // 2]) is None and s.out == []  # held
    assert s.read(wire[len(wire) // 2 :]) is None
    assert s.out == [("message", payload)]
    assert type(s.out[0][1]) is bytes  # as websockets gives it (uvicorn queues bytes)


def test_a_frame_fed_a_byte_at_a_time_comes_out_at_its_last_byte() -> None:
    s = Splitter()
    wire = encode(AUDIO, b"x" * 150)  # 16-bit length: its header too comes a byte at a time
    for byte in wire[:-1]:
        assert s.read(bytes([byte])) is None
    assert s.out == []
    s.read(wire[-1:])
    assert s.out == [("message", b"x" * 150)]


def test_the_size_limit_is_websockets_message_limit() -> None:
    s = Splitter(max_size=1000)
    s.read(encode(AUDIO, b"a" * 1000))
    assert s.out == [("message", b"a" * 1000)]
    too_large = encode(AUDIO, b"", declared=1001)
    assert s.read(too_large) == too_large  # websockets refuses it (1009)


def test_what_it_cannot_judge_goes_back_with_everything_after_it() -> None:
    s = Splitter()
    unmasked = encode(AUDIO, b"u", mask=None)
    after = encode(AUDIO, b"after")
    rest = s.read(encode(AUDIO, b"one") + encode(AUDIO, b"two") + unmasked + after)
    assert s.out == [("message", b"one"), ("message", b"two")]
    assert rest == unmasked + after
    assert s.splitter.give_up() == b""  # nothing held: ready for the next take-over
    s.read(encode(AUDIO, b"again"))
    assert s.out[-1] == ("message", b"again") and s.splitter.rest is None


def test_an_incomplete_frame_is_waited_for_up_to_max_held() -> None:
    s = Splitter(max_held=200)
    short, long = encode(AUDIO, b"s" * 150), encode(AUDIO, b"l" * 300)
    assert s.read(short[:100]) is None  # 156 bytes in all: waited for
    s.read(short[100:])
    assert s.out == [("message", b"s" * 150)]
    assert s.read(long[:100]) == long[:100]  # 306 bytes: websockets waits for it instead


def test_other_frames_are_returned_whole_in_order() -> None:
    s = Splitter()
    text = encode(FIN | Opcode.TEXT, b'{"type": "mark"}')
    ping = encode(FIN | Opcode.PING, b"are you there")
    s.read(encode(AUDIO, b"1") + text + encode(AUDIO, b"2") + ping[:3])
    s.read(ping[3:] + encode(AUDIO, b"3"))
    assert s.out == [
        ("message", b"1"),
        ("frame", text),
        ("message", b"2"),
        ("frame", ping),
        ("message", b"3"),
    ]


def test_a_fragmented_message_is_websockets_until_its_last_part() -> None:
    """Inside a fragmented message a whole binary frame is a protocol error: websockets'
    to report, so it is returned, not taken; control frames may come between the parts."""
    s = Splitter()
    first, inside = encode(Opcode.BINARY, b"part 1"), encode(AUDIO, b"error")
    ping, middle = encode(FIN | Opcode.PING, b""), encode(Opcode.CONT, b"part 2")
    last = encode(FIN | Opcode.CONT, b"part 3")
    s.read(first + ping + middle + inside + last + encode(AUDIO, b"audio"))
    assert s.out == [
        ("frame", first),
        ("frame", ping),
        ("frame", middle),
        ("frame", inside),
        ("frame", last),
        ("message", b"audio"),
    ]


def test_giving_up_returns_what_is_held_and_starts_afresh() -> None:
    s = Splitter()
    first = encode(Opcode.BINARY, b"part 1")
    audio = encode(AUDIO, b"audio")
    s.read(first + audio[:4])
    assert s.out == [("frame", first)]
    assert s.splitter.give_up(b"more") == audio[:4] + b"more"
    s.read(audio)  # not inside a fragmented message any more: a message
    assert s.out[-1] == ("message", b"audio")


def test_garbage_is_returned_for_websockets_to_refuse() -> None:
    s = Splitter()
    reserved = encode(0xC0 | Opcode.BINARY, b"rsv1")
    bad_opcode = encode(FIN | 0x3, b"three")
    s.read(reserved + bad_opcode)
    assert s.out == [("frame", reserved), ("frame", bad_opcode)]


def test_it_takes_over_only_where_websockets_waits_for_a_frame() -> None:
    conn = ServerProtocol(state=State.OPEN, max_size=1000)
    assert at_frame_boundary(conn)
    conn.receive_data(encode(AUDIO, b"whole"))
    assert at_frame_boundary(conn)
    conn.receive_data(encode(AUDIO, b"half")[:3])
    assert not at_frame_boundary(conn)  # in the middle of a frame
    conn = ServerProtocol(state=State.OPEN, max_size=1000)
    conn.receive_data(encode(Opcode.BINARY, b"part 1"))
    assert not at_frame_boundary(conn)  # inside a fragmented message
    conn.receive_data(encode(FIN | Opcode.CONT, b"part 2"))
    assert at_frame_boundary(conn)
    conn.receive_data(encode(AUDIO, b"u", mask=None))
    assert not at_frame_boundary(conn)  # failed
    connecting = ServerProtocol(max_size=1000)
    assert not at_frame_boundary(connecting)  # before the handshake

"""AudioJitterBuffer: in-order packets pass at once, a hole costs one frame, late ones drop."""

from __future__ import annotations

from aiortc.rtp import RtpPacket

from voxserve.server.webrtc.jitter import BURST, REORDER, AudioJitterBuffer


def feed(buffer: AudioJitterBuffer, order: list[int], base: int = 0) -> list[int]:
    """Packets with these frame indexes, in this order; returns the frame indexes handed on."""
    out = []
    for index in order:
        packet = RtpPacket(sequence_number=(base + index) & 0xFFFF, timestamp=index * 960)
        packet._data = bytes([index & 0xFF])  # type: ignore[attr-defined]
        pli, frame = buffer.add(packet)
        assert not pli
        if frame is not None:
            handed = frame.timestamp // 960
            assert frame.data == bytes([handed & 0xFF])  # the payload goes with its packet
            out.append(handed)
    return out


def test_in_order_packets_pass_without_delay() -> None:
    buffer = AudioJitterBuffer()
    assert feed(buffer, list(range(10))) == list(range(10))


def test_a_reordered_packet_is_waited_for() -> None:
    buffer = AudioJitterBuffer()
    assert feed(buffer, [0, 1, 3, 2, 4, 5]) == [0, 1, 2, 3, 4]
    assert buffer.skipped == 0 and buffer.late == 0


def test_a_lost_packet_costs_one_frame_only() -> None:
    buffer = AudioJitterBuffer()
    order = [i for i in range(40) if i not in (10, 20, 21)]
    out = feed(buffer, order)
    assert buffer.skipped == 3
    assert out == [i for i in range(40 - 2) if i not in (10, 20, 21)]  # 2 still held back


def test_late_and_duplicate_packets_are_dropped() -> None:
    buffer = AudioJitterBuffer()
    out = feed(buffer, [0, 1, 3, 4, 5, 2, 5, 6])  # 2 comes after it was given up on
    assert out == [0, 1, 3, 4]  # 5 waits behind 4, one frame per packet
    assert buffer.skipped == 1 and buffer.late == 2


def test_sequence_numbers_wrap_around() -> None:
    buffer = AudioJitterBuffer()
    assert feed(buffer, list(range(20)), base=65530) == list(range(20))


def test_a_restarted_stream_is_followed() -> None:
    buffer = AudioJitterBuffer()
    feed(buffer, [0, 1, 2])
    assert feed(buffer, [5000, 5001], base=0) == [5000, 5001]
    assert buffer.resyncs == 1


def test_a_flood_faster_than_real_time_is_dropped_and_counted() -> None:
    """1000 packets at once (20 s of audio): a burst passes, the rest would only be decoded
    and queued on the track at the caller's pace, so they are dropped and counted."""
    buffer = AudioJitterBuffer(clock=lambda: 100.0)  # all at one instant
    out = feed(buffer, list(range(1000)))
    assert BURST - REORDER <= len(out) <= BURST + 1
    assert buffer.flooded >= 1000 - BURST - 1
    now = [100.0]
    paced = AudioJitterBuffer(clock=lambda: now[0])
    for index in range(1000):  # the same 1000 at 50 a second: all pass
        now[0] += 0.02
        feed(paced, [index])
    assert paced.flooded == 0 and paced.skipped == 0

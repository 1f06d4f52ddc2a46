"""OutboundTrack: reply audio paced at 20 ms a frame, silence between replies, exact accounting."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError

from tests.webrtc.media import rms, tone
from voxserve.errors import VoxError
from voxserve.server.webrtc.outbound import OutboundTrack


def pcm_ms(ms: int) -> bytes:
    return tone(440, 48 * ms).tobytes()


def frame_pcm(frame: object) -> bytes:
    from av import AudioFrame

    assert isinstance(frame, AudioFrame)
    return bytes(frame.planes[0])[: frame.samples * 2]


async def test_frames_are_paced_in_real_time() -> None:
    track = OutboundTrack()
    first = await track.recv()
    began = time.monotonic()
    pts = [first.pts]
    for _ in range(10):
        pts.append((await track.recv()).pts)
    took = time.monotonic() - began
    assert 0.15 < took < 0.4
    assert pts == [i * 960 for i in range(11)]
    assert first.sample_rate == 48_000 and first.samples == 960
    assert first.format.name == "s16" and first.layout.name == "mono"
    assert float(first.time_base) == 1 / 48_000


async def test_silence_when_nothing_is_buffered() -> None:
    track = OutboundTrack()
    assert frame_pcm(await track.recv()) == bytes(1920)
    assert track.buffered_ms == 0


async def test_reply_accounting_and_callbacks() -> None:
    track = OutboundTrack()
    events: list[tuple[str, int]] = []
    track.on_started = lambda r: events.append(("started", r))
    track.on_stopped = lambda r: events.append(("stopped", r))
    track.write(pcm_ms(50), reply=1)
    assert track.buffered_ms == 50
    track.finish(1)
    assert rms(frame_pcm(await track.recv())) > 1000
    assert events == [("started", 1)]
    assert track.played_ms(1) == 20
    await track.recv()
    last = frame_pcm(await track.recv())  # 10 ms of audio, then padded with silence
    assert rms(last[:960]) > 1000 and last[960:] == bytes(960)
    assert events == [("started", 1), ("stopped", 1)]
    assert track.played_ms(1) == 50 and track.buffered_ms == 0
    assert frame_pcm(await track.recv()) == bytes(1920)


async def test_underrun_mid_reply_waits_for_a_whole_frame() -> None:
    track = OutboundTrack()
    track.write(pcm_ms(10), reply=3)
    assert frame_pcm(await track.recv()) == bytes(1920)  # not finished: keep the 10 ms
    assert track.played_ms(3) == 0
    track.write(pcm_ms(10), reply=3)
    assert rms(frame_pcm(await track.recv())) > 1000
    assert track.played_ms(3) == 20


async def test_a_frame_carries_one_reply_only() -> None:
    track = OutboundTrack()
    stopped: list[int] = []
    track.on_stopped = stopped.append
    track.write(pcm_ms(30), reply=1)
    track.finish(1)
    track.write(pcm_ms(20), reply=2)
    await track.recv()
    await track.recv()
    assert track.played_ms(1) == 30 and track.played_ms(2) == 0 and stopped == [1]
    await track.recv()
    assert track.played_ms(2) == 20


async def test_clear_drops_the_buffer_without_stopped() -> None:
    track = OutboundTrack()
    stopped: list[int] = []
    track.on_stopped = stopped.append
    track.write(pcm_ms(100), reply=1)
    await track.recv()
    assert track.clear() == 80
    assert track.played_ms(1) == 20 and track.buffered_ms == 0
    track.write(pcm_ms(40), reply=1)  # late audio of the cut-off reply is dropped
    track.finish(1)
    assert frame_pcm(await track.recv()) == bytes(1920)
    assert stopped == []
    track.write(pcm_ms(20), reply=2)  # the next reply plays
    assert rms(frame_pcm(await track.recv())) > 1000


async def test_finish_after_all_audio_went_out_stops_at_once() -> None:
    track = OutboundTrack()
    stopped: list[int] = []
    track.on_stopped = stopped.append
    track.finish(7)  # a reply without audio: neither started nor stopped
    assert stopped == []
    track.write(pcm_ms(20), reply=8)
    await track.recv()
    track.finish(8)
    assert stopped == [8]


async def test_lag_records_a_late_consumer() -> None:
    track = OutboundTrack()
    seen: list[float] = []
    track.lag.sink = seen.append  # the metrics histogram takes seconds
    await track.recv()
    await track.recv()
    assert track.lag.frames == 2 and track.lag.late_frames <= 1
    time.sleep(0.06)  # noqa: ASYNC251  # the loop blocked: the next frames are late
    began = time.monotonic()
    await track.recv()
    await track.recv()
    assert time.monotonic() - began < 0.015
    assert track.lag.late_frames >= 2 and track.lag.max_ms >= 30
    assert track.lag.percentile(100) == track.lag.max_ms
    assert len(seen) == 4 and all(s >= 0 for s in seen) and max(seen) >= 0.03
    await asyncio.sleep(0.3)  # far behind: the clock is re-anchored instead of bursting
    await track.recv()
    assert track.lag.resyncs == 1
    began = time.monotonic()
    await track.recv()
    assert time.monotonic() - began > 0.01


def test_odd_length_pcm_is_refused() -> None:
    with pytest.raises(VoxError):
        OutboundTrack().write(b"\x00", reply=1)


async def test_stopped_track_ends() -> None:
    track = OutboundTrack()
    track.stop()
    with pytest.raises(MediaStreamError):
        await track.recv()


async def test_written_audio_is_sent_unchanged() -> None:
    track = OutboundTrack()
    audio = np.arange(960 * 3, dtype=np.int16).tobytes()
    track.write(audio[:1000], reply=1)
    track.write(audio[1000:], reply=1)
    track.finish(1)
    out = b"".join([frame_pcm(await track.recv()) for _ in range(3)])
    assert out == audio


async def test_a_failing_callback_does_not_stop_the_track() -> None:
    track = OutboundTrack()

    def broken(reply: int) -> None:
        raise RuntimeError("link gone")

    track.on_started = broken
    track.write(pcm_ms(40), reply=1)
    track.finish(1)
    await track.recv()
    await track.recv()
    assert track.played_ms(1) == 40
    track.write(pcm_ms(20), reply=1)  # a finished reply takes no more audio
    assert track.buffered_ms == 0

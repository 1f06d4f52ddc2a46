"""InboundAudio: decoded WebRTC frames -> exact 20 ms PCM16 frames at 16 kHz, loss concealed."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from av import AudioFrame

from tests.webrtc.media import FramesTrack, peak_hz, rms, stereo_frame, tone, tone_frames
from voxserve.server.webrtc_inbound import InboundAudio


async def read_all(inbound: InboundAudio) -> list[bytes]:
    frames = []
    while (frame := await inbound.read()) is not None:
        frames.append(frame)
    return frames


async def test_exact_20ms_frames_at_16k() -> None:
    inbound = InboundAudio(FramesTrack(tone_frames(440, 50)))
    frames = await read_all(inbound)
    assert all(len(f) == 640 for f in frames)
    assert len(frames) == 50  # 1 s of 48 kHz in, 1 s of 16 kHz out
    assert inbound.packets_received == 50
    assert inbound.packets_lost == 0 and inbound.concealed_ms == 0
    assert await inbound.read() is None  # stays ended


async def test_other_packet_time_is_reframed() -> None:
    inbound = InboundAudio(FramesTrack(tone_frames(440, 25, size=1920)))  # 40 ms packets
    frames = await read_all(inbound)
    assert len(frames) == 50 and all(len(f) == 640 for f in frames)


async def test_tone_survives_resampling() -> None:
    inbound = InboundAudio(FramesTrack(tone_frames(440, 50)))
    pcm = b"".join(await read_all(inbound))
    assert abs(peak_hz(pcm[3200:-3200], 16_000) - 440) < 5


async def test_gap_is_counted_and_concealed_and_keeps_the_timeline() -> None:
    inbound = InboundAudio(FramesTrack(tone_frames(440, 50, skip=frozenset({20, 21, 22, 23, 24}))))
    frames = await read_all(inbound)
    assert inbound.packets_received == 45
    assert inbound.packets_lost == 5
    assert inbound.concealed_ms == 100
    assert len(frames) == 50  # the lost 100 ms are filled: the timeline is exact
    # the first 60 ms of the gap fade the last frame out, the rest is silence
    fade = b"".join(frames[20:22])
    silent = b"".join(frames[24:25])
    assert rms(fade) > 1000
    assert rms(silent) < rms(fade) / 20
    assert rms(b"".join(frames[27:])) > 5000  # the audio after the gap is intact


async def test_late_duplicate_and_backwards_frames_are_dropped() -> None:
    a = tone(440, 960)
    frames = [
        stereo_frame(a, a, 0),
        stereo_frame(a, a, 960),
        stereo_frame(a, a, 960),  # duplicate
        stereo_frame(a, a, 0),  # backwards
        stereo_frame(a, a, 1920),
    ]
    inbound = InboundAudio(FramesTrack(frames))
    out = await read_all(inbound)
    assert inbound.packets_dropped == 2
    assert inbound.packets_received == 3 and inbound.packets_lost == 0
    assert len(out) == 3


async def test_stereo_is_downmixed() -> None:
    a = tone(440, 960)
    opposite = [stereo_frame(a, (-a.astype(np.int32)).astype(np.int16), i * 960) for i in range(10)]
    assert rms(b"".join(await read_all(InboundAudio(FramesTrack(opposite))))) < 50
    silence = np.zeros(960, dtype=np.int16)
    one_side = [stereo_frame(tone(440, 960, start=i * 960), silence, i * 960) for i in range(10)]
    both = [
        stereo_frame(tone(440, 960, start=i * 960), tone(440, 960, start=i * 960), i * 960)
        for i in range(10)
    ]
    half = rms(b"".join(await read_all(InboundAudio(FramesTrack(one_side))))[640:-640])
    full = rms(b"".join(await read_all(InboundAudio(FramesTrack(both))))[640:-640])
    assert 0.45 < half / full < 0.55


async def test_ended_track_reads_none() -> None:
    inbound = InboundAudio(FramesTrack([]))
    assert await inbound.read() is None
    assert inbound.ended


async def test_g711_mono_8k_frames_are_upsampled() -> None:
    """PCMU/PCMA (a SIP peer) decode to s16 mono 8 kHz: same timeline, resampled once."""
    frames = []
    for i in range(25):
        frame = AudioFrame.from_ndarray(
            tone(440, 160, rate=8000, start=i * 160).reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate, frame.time_base, frame.pts = 8000, Fraction(1, 8000), i * 160
        frames.append(frame)
    inbound = InboundAudio(FramesTrack(frames))
    out = await read_all(inbound)
    assert len(out) == 25 and inbound.packets_lost == 0
    assert abs(peak_hz(b"".join(out)[1280:-1280], 16_000) - 440) < 10


async def test_pts_running_ahead_of_the_clock_are_not_filled() -> None:
    """A hostile caller jumps its pts 9 s on every 20 ms packet: the gaps would turn 20
    packets into 3 minutes of audio for the session. The filled timeline stays within
    MAX_AHEAD_S of the wall clock; the rest are discontinuities."""
    mono = tone(440, 960)
    jump = 9 * 48_000
    frames = [stereo_frame(mono, mono, pts=i * jump) for i in range(20)]
    inbound = InboundAudio(FramesTrack(frames))
    out = await read_all(inbound)
    assert inbound.packets_received == 20
    assert inbound.concealed_ms == 0  # the first jump is already past the allowance
    assert inbound.discontinuities == 19
    assert len(out) == 20  # just the real audio: 20 packets -> 400 ms


async def test_a_gap_within_the_allowance_is_still_filled() -> None:
    """Frames read in a burst (a backlog) may run ahead of the clock by up to MAX_AHEAD_S:
    a real loss in them is filled as usual."""
    frames = tone_frames(440, 60, skip=frozenset(range(20, 40)))  # 400 ms lost in 1.2 s
    inbound = InboundAudio(FramesTrack(frames))
    out = await read_all(inbound)
    assert inbound.concealed_ms == 400 and inbound.discontinuities == 0
    assert len(out) == 60

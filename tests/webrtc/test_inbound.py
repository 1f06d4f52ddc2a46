"""InboundAudio: decoded WebRTC frames -> exact 20 ms PCM16 frames at 16 kHz, loss concealed."""

from __future__ import annotations

import asyncio
import time
from fractions import Fraction

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from tests.webrtc.media import FramesTrack, peak_hz, rms, stereo_frame, tone, tone_frames
from voxserve.server.webrtc.inbound import PLAYOUT_S, InboundAudio
from voxserve.server.webrtc.jitter import AudioJitterBuffer

SILENCE = bytes(640)


async def read_all(inbound: InboundAudio) -> list[bytes]:
    """The frames of a track that ends: read until it ended (then read() gives silence)."""
    frames = []
    while not inbound.ended:
        frames.append(await inbound.read())
    return frames


async def test_exact_20ms_frames_at_16k() -> None:
    inbound = InboundAudio(FramesTrack(tone_frames(440, 50)))
    frames = await read_all(inbound)
    assert all(len(f) == 640 for f in frames)
    assert len(frames) == 50  # 1 s of 48 kHz in, 1 s of 16 kHz out
    assert inbound.packets_received == 50
    assert inbound.packets_lost == 0 and inbound.concealed_ms == 0
    assert inbound.silence_ms == 0 and inbound.ended


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


async def test_ended_track_reads_silence() -> None:
    inbound = InboundAudio(FramesTrack([]))
    assert await inbound.read() == bytes(640)
    assert inbound.ended and inbound.silence_ms == 20 and inbound.packets_lost == 0


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


# -- the clock: a caller that stops sending ----------------------------------------------------


Step = AudioFrame | float | asyncio.Event


class ScriptTrack(MediaStreamTrack):
    """A remote track that plays a script: a frame (given now), a float (wait until that
    many seconds after the first recv), an Event (wait for it); then it ends (`end`) or
    stalls for good, as a caller that stopped sending without a BYE."""

    kind = "audio"

    def __init__(self, script: list[Step], *, end: bool) -> None:
        super().__init__()
        self._script = list(script)
        self._end = end
        self._start: float | None = None

    async def recv(self) -> AudioFrame:
        if self._start is None:
            self._start = time.monotonic()
        while self._script:
            step = self._script.pop(0)
            if isinstance(step, AudioFrame):
                return step
            if isinstance(step, asyncio.Event):
                await step.wait()
            else:
                await asyncio.sleep(max(0.0, self._start + step - time.monotonic()))
        if not self._end:
            await asyncio.Event().wait()
        self.stop()
        raise MediaStreamError


async def timed_reads(inbound: InboundAudio, count: int) -> list[tuple[float, bytes]]:
    """`count` frames, each with the time read() gave it."""
    out = []
    for _ in range(count):
        frame = await inbound.read()
        out.append((time.monotonic(), frame))
    return out


async def until_silence(inbound: InboundAudio) -> tuple[list[tuple[float, bytes]], float]:
    """The real frames read until the first silence, and the time that silence came.
    (How many frames N frames in make is the resampler's: soxr HQ holds ~28 ms back.)"""
    real = []
    while len(real) < 100:
        frame = await inbound.read()
        if frame == SILENCE:
            return real, time.monotonic()
        real.append((time.monotonic(), frame))
    raise AssertionError("no silence")


def pulling(inbound: InboundAudio) -> bool:
    return any(t.get_name() == "webrtc-inbound" and not t.done() for t in asyncio.all_tasks())


async def test_a_stalled_track_gives_silence_at_the_due_times() -> None:
    """The caller stops sending (a muted track, DTX, a vanished peer): each 20 ms slot is
    given as silence PLAYOUT_S after it was due, so the VAD hears the turn end."""
    inbound = InboundAudio(ScriptTrack(tone_frames(440, 6), end=False))
    before = time.monotonic()
    real, silent_at = await until_silence(inbound)
    stalled = [(silent_at, SILENCE), *await timed_reads(inbound, 9)]
    first = real[0][0]
    assert len(real) >= 4
    for k, (at, frame) in enumerate(stalled, start=len(real)):
        assert frame == SILENCE
        assert at >= before + k * 0.02 + PLAYOUT_S - 0.002  # never early
        assert at <= first + k * 0.02 + PLAYOUT_S + 0.1  # nor much late
    assert inbound.silence_ms == 200 and not inbound.ended
    assert inbound.packets_lost == 0 and inbound.concealed_ms == 0  # silence is not loss
    assert pulling(inbound)
    inbound.close()  # the call ended: the task pulling the track goes
    await asyncio.sleep(0)
    assert not pulling(inbound)


async def test_an_ended_track_keeps_giving_silence_in_real_time() -> None:
    """A file played to its end (aiortc's MediaPlayer): the track ends, the session still
    hears time pass (never None), at real-time pace, until the call ends it."""
    inbound = InboundAudio(ScriptTrack(tone_frames(440, 5), end=True))
    began = time.monotonic()
    reads = await timed_reads(inbound, 30)
    assert all(frame != SILENCE for _, frame in reads[:5])
    assert all(frame == SILENCE for _, frame in reads[5:])
    assert inbound.ended and inbound.silence_ms == 500
    # The timeline's slot 0 is taken inside the first read(), after `began` and before
    # reads[0]'s stamp (a stamp a descheduled test thread took 7 ms late on loaded CI):
    # slot 29 is due 0.58 s after it.
    assert reads[-1][0] - began >= 29 * 0.02 - 0.005
    assert reads[-1][0] - reads[0][0] <= 29 * 0.02 + 0.15
    assert not pulling(inbound)  # the track ended: nothing left pulling it
    inbound.close()


async def test_audio_resuming_after_silence_reanchors_the_timeline() -> None:
    """The network held the audio back past PLAYOUT_S (silence was given): when it comes,
    it plays from that moment, frame for frame, with no fill for the pause (its pts jumped
    as a DTX caller's do) and no backlog; later slots are due from there."""
    frames = tone_frames(440, 40)
    gate = asyncio.Event()
    script: list[Step] = [*frames[:12], gate, *frames[30:]]  # the pause: 18 frames of pts
    inbound = InboundAudio(ScriptTrack(script, end=False))
    real, _ = await until_silence(inbound)
    silent = await timed_reads(inbound, 4)
    assert all(frame == SILENCE for _, frame in silent)
    gate.set()
    opened = time.monotonic()
    resumed, after = await until_silence(inbound)
    heard = [
        stereo_frame(m, m, (12 + j) * 960)
        for j, m in enumerate(tone(440, 960, start=i * 960) for i in range(30, 40))
    ]
    reference = await read_all(InboundAudio(FramesTrack([*frames[:12], *heard])))
    got = np.frombuffer(b"".join(frame for _, frame in real + resumed), dtype="<i2")
    assert len(real) + len(resumed) >= 20
    want = np.frombuffer(b"".join(reference[: len(real) + len(resumed)]), dtype="<i2")
    assert np.abs(got.astype(np.int32) - want).max() <= 4  # the same audio: nothing filled
    assert resumed[0][0] - opened < 0.1  # played at once, not at the old timeline's slot
    assert inbound.packets_lost == 0 and inbound.concealed_ms == 0
    assert inbound.reanchors == 1 and inbound.silence_ms == 120  # 5 before, 1 after
    # the next slot is due after the resumed frames, from the resumption (the old
    # timeline's slot is long past)
    assert after >= opened + len(resumed) * 0.02 + PLAYOUT_S - 0.002
    inbound.close()


async def test_dtx_pauses_are_silence_short_holes_are_loss() -> None:
    """A DTX caller paced in real time: a 400 ms pause (no packets, pts jump) is given as
    silence once PLAYOUT_S passed, not counted as loss; a 40 ms hole (within PLAYOUT_S) is
    a lost stretch: concealed and counted as before."""
    frames = tone_frames(440, 60)
    script: list[Step] = []
    for i in [*range(10), *range(30, 40), *range(42, 60)]:  # pause 10..29; hole 40, 41
        script += [i * 0.02, frames[i]]
    inbound = InboundAudio(ScriptTrack(script, end=True))
    started = time.monotonic()
    out = await read_all(inbound)
    took = time.monotonic() - started
    silence = (0.4 - PLAYOUT_S) * 1000  # the pause's slots PLAYOUT_S past due
    assert silence - 60 <= inbound.silence_ms <= silence + 100
    assert inbound.packets_lost == 2 and inbound.concealed_ms == 40
    assert inbound.reanchors == 1 and inbound.packets_received == 38
    assert len(out) == 38 + 2 + inbound.silence_ms // 20
    assert took < 60 * 0.02 + 0.3  # real time, no backlog built up
    inbound.close()


async def test_audio_held_up_behind_the_network_is_not_given_as_silence() -> None:
    """Packets keep coming off the network but their frames come out late (aiortc's
    decoder thread or the event loop stalled, as on a loaded machine): the slots wait for
    them (up to PLAYOUT_S + HOLD_S), so the caller's sentence is not cut by a silence that
    was never spoken; with no packets coming, the same lateness is silence (the test above)."""
    frames = tone_frames(440, 40)
    gate = asyncio.Event()
    inbound = InboundAudio(ScriptTrack([*frames[:10], gate, *frames[10:]], end=True))
    inbound.jitter = AudioJitterBuffer()

    async def network() -> None:  # packets arriving every 20 ms while the decoder is stuck
        assert inbound.jitter is not None
        for _ in range(20):
            inbound.jitter.last_packet_at = time.monotonic()
            await asyncio.sleep(0.02)
        gate.set()

    arriving = asyncio.create_task(network())
    out = await read_all(inbound)
    await arriving
    assert inbound.silence_ms == 0  # 400 ms late, packets coming: waited, not silence
    assert len(out) >= 39 and all(frame != SILENCE for frame in out[:38])
    inbound.close()

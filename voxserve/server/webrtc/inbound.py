"""The caller's WebRTC audio track -> 20 ms PCM16 mono frames at the engines' rate, on a clock.

aiortc's receiver reorders packets (its jitter buffer) and decodes Opus to s16 stereo 48 kHz
frames whose pts (time base 1/48000) follow the RTP timestamps, but it does not conceal loss:
a lost packet is only a jump in pts. This reader keeps the audio timeline exact: a gap is
filled (the last frame repeated, fading out over CONCEAL_MS, then silence) and counted, late or
duplicate frames are dropped and counted, and the audio is downmixed and resampled once with a
streaming soxr resampler, so VAD and ASR see the same time as the caller spoke.

Playout is clock-driven, as a WebRTC receiver's: a caller may stop sending (its file or
track ended, a muted track, Opus DTX sends nothing in silence), and the session's VAD must
still hear the silence that ends a turn. A task pulls the track as packets come; read()
gives the next frame as soon as it is there, and when the network has not delivered the
audio of a 20 ms slot (slots are counted on time.monotonic() from the first frame) within
PLAYOUT_S of its due time, and no packet came off the network for PLAYOUT_S either (else at
most HOLD_S more: see _silence_at), it gives silence (`silence_ms`, not loss). Once the track ended
it gives silence at real-time pace until the call ends it (never None). Audio that comes
back after silence was given re-anchors the timeline at that moment: the gap already given
as silence is not filled again, and there is no backlog to play.

The pts are the caller's to choose: a hostile peer could jump them ~MAX_GAP_S on every
packet and have one 20 ms packet filled with seconds of audio for the session to hear. So
the timeline made here (real audio, fill and silence given) may run at most MAX_AHEAD_S
ahead of the wall clock since its anchor: a gap that would go further is a discontinuity
(not filled), and real frames beyond it (a caller sending faster than real time, e.g. 120 ms
Opus packets at the jitter buffer's packet rate) are dropped. An honest caller's timeline
never runs ahead but by the backlog of frames read late. A stall also leaves the last ~28 ms
the resampler holds (soxr HQ's delay) until audio resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from fractions import Fraction

import numpy as np
from aiortc import RTCRtpReceiver
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from voxserve.audio.pcm import Int16Array
from voxserve.audio.resample import StreamResampler
from voxserve.server.webrtc.jitter import AudioJitterBuffer, use_audio_jitter_buffer

FRAME_MS = 20
CONCEAL_MS = 60  # a lost stretch longer than this is silence after the fade-out
MAX_GAP_S = 10.0  # a larger pts jump is a discontinuity (the peer reset its clock): not filled
MAX_AHEAD_S = 2.0  # how far the timeline may run ahead of the wall clock (docstring)
# how late a slot's audio may come before it is given as silence: webrtc_jitter's wait for a
# lost packet (REORDER later ones: 60 ms) plus aiortc's decoder thread and the network's
# jitter. Measured on loopback (tests/webrtc/test_loopback.py's call, 2 loaded cores): real
# frames up to 44 ms late without loss, up to 106 ms late behind a concealed hole.
PLAYOUT_S = 0.15
# how much longer a slot waits while packets keep coming (a stall of the loop or of aiortc's
# decoder thread, not a pause of the caller's): bounded, so a broken decoder still ends turns
HOLD_S = 0.6


def mono_samples(frame: AudioFrame) -> Int16Array:
    """Decoded samples downmixed to mono int16 (packed or planar, int16 or float)."""
    channels = max(1, len(frame.layout.channels))
    data = frame.to_ndarray()
    if frame.format.is_planar:
        multi = data.reshape(channels, -1).T
    else:
        multi = data.reshape(-1, channels)
    if multi.dtype.kind == "f":
        scaled = np.clip(multi.mean(axis=1), -1.0, 1.0) * 32767.0
        out: Int16Array = scaled.astype(np.int16)
        return out
    if channels == 1:
        mono: Int16Array = multi[:, 0].astype(np.int16, copy=False)
        return mono
    wide = multi.astype(np.int32).sum(axis=1) // channels
    mixed: Int16Array = wide.astype(np.int16)
    return mixed


def _pts_in_samples(frame: AudioFrame) -> int | None:
    if frame.pts is None or frame.time_base is None:
        return None
    return round(Fraction(frame.pts) * Fraction(frame.time_base) * frame.sample_rate)


class InboundAudio:
    """Reads a remote audio track as 20 ms PCM16 frames on a clock; counts loss, concealment
    and the silence given while the caller sent nothing.

    One task reads. packets_lost counts pts gaps (in packets of the last frame's size) that
    came within PLAYOUT_S; a longer pause (DTX, a muted or ended track) is silence_ms, not loss.

    Given the track's `receiver` (before media flows: at the "track" event), it also puts an
    AudioJitterBuffer in it in place of aiortc's, which loses ~5 frames per lost packet.
    close() (the peer's, when the call ends) stops the task that pulls the track.
    """

    def __init__(
        self,
        track: MediaStreamTrack,
        *,
        rate: int = 16_000,
        receiver: RTCRtpReceiver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.track = track
        self.jitter: AudioJitterBuffer | None = (
            None if receiver is None else use_audio_jitter_buffer(receiver)
        )
        self.rate = rate
        self.clock = clock
        self.frame_bytes = rate * FRAME_MS // 1000 * 2
        self._silence = bytes(self.frame_bytes)  # one constant, given as is
        self.packets_received = 0
        self.packets_lost = 0
        self.packets_dropped = 0  # late, duplicate or backwards frames, or too far ahead
        self.discontinuities = 0  # pts jumps beyond MAX_GAP_S or the clock: not filled
        self.concealed_ms = 0
        self.silence_ms = 0  # given while no audio came (a stall, DTX, the track ended)
        self.reanchors = 0  # audio resumed after silence: the timeline starts again there
        self.max_late_ms = 0  # the latest a frame came after its slot was due (< PLAYOUT_S)
        self.last_packet_at = clock()
        self._anchor: float | None = None  # clock() of slot 0 (the first frame, or resumption)
        self._played = 0  # frames given since the anchor's slot 0
        self._silent = False  # silence given since the last real frame
        self._concealed_s = 0.0
        self._in_rate = 0
        self._resampler: StreamResampler | None = None
        self._next_pts: int | None = None  # expected pts of the next frame, in input samples
        self._last: Int16Array | None = None  # last real frame (mono, input rate)
        self._pending = bytearray()
        self._ended = False
        self._arrived = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None

    @property
    def last_heard_at(self) -> float:
        """time.monotonic() of the caller's last packet as it came off the network (its
        jitter buffer's, when installed): silence given is not a packet heard."""
        if self.jitter is None:
            return self.last_packet_at
        return max(self.jitter.last_packet_at, self.last_packet_at)

    @property
    def ended(self) -> bool:
        """The track ended and all its audio was read (read() now gives silence)."""
        return self._ended and len(self._pending) < self.frame_bytes

    async def read(self) -> bytes:
        """The next 20 ms frame: the caller's audio as soon as it is there, else silence
        once its slot is PLAYOUT_S past due (due, once the track ended)."""
        if self._pump is None:
            self._pump = asyncio.get_running_loop().create_task(self._pull(), name="webrtc-inbound")
        while True:
            now = self.clock()
            if len(self._pending) >= self.frame_bytes:
                anchor = self._anchor
                if self._silent or anchor is None:
                    anchor = self._reanchor(now)
                due = anchor + self._played * FRAME_MS / 1000
                self.max_late_ms = max(self.max_late_ms, round((now - due) * 1000))
                self._played += 1
                out = bytes(self._pending[: self.frame_bytes])
                del self._pending[: self.frame_bytes]
                return out
            if self._anchor is None:
                if not self._ended:
                    await self._wait(None)
                    continue
                self._anchor = now
            deadline = self._silence_at()
            if now >= deadline:
                self._played += 1
                self._silent = True
                self.silence_ms += FRAME_MS
                return self._silence
            await self._wait(deadline - now)

    def _silence_at(self) -> float:
        """When the next slot, its audio not here, is given as silence: PLAYOUT_S past due,
        and later while packets still come off the network (up to HOLD_S more). Audio the
        jitter buffer holds or the decoder is working on (a loop or thread stall delayed it)
        is the caller still speaking: giving its slots as silence would end the turn in the
        middle of a sentence (seen on loaded CI: a transcript cut short). When the caller
        sent nothing for PLAYOUT_S (DTX, a muted track), silence is given at the due time."""
        assert self._anchor is not None
        due = self._anchor + self._played * FRAME_MS / 1000
        if self._ended:
            return due
        return due + PLAYOUT_S + min(HOLD_S, max(0.0, self.last_heard_at - due))

    def close(self) -> None:
        """Stop pulling the track (the call ended). Idempotent."""
        if self._pump is not None:
            self._pump.cancel()
        self._ended = True
        self._arrived.set()

    def _reanchor(self, now: float) -> float:
        """The slot of the frame given now is due now (audio back after silence)."""
        if self._anchor is not None:
            self.reanchors += 1
        self._anchor = now - self._played * FRAME_MS / 1000
        self._silent = False
        return self._anchor

    async def _wait(self, timeout_s: float | None) -> None:
        """Until a frame arrives or the track ends, at most `timeout_s`."""
        self._arrived.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._arrived.wait()

    async def _pull(self) -> None:
        """Frames off the track as they come (decoded, resampled) until it ends."""
        try:
            while True:
                try:
                    frame = await self.track.recv()
                except MediaStreamError:
                    self._end()
                    return
                if isinstance(frame, AudioFrame):
                    self._accept(frame)
                    self._arrived.set()
        finally:
            self._ended = True
            self._arrived.set()

    def _end(self) -> None:
        self._ended = True
        if self._resampler is not None:
            self._emit_resampled(self._resampler.flush())
        tail = len(self._pending) % self.frame_bytes
        if tail:  # the last frame padded to 20 ms
            self._pending.extend(bytes(self.frame_bytes - tail))

    def _accept(self, frame: AudioFrame) -> None:
        samples = mono_samples(frame)
        if samples.size == 0:
            return
        now = self.clock()
        if self._anchor is None:
            self._anchor = now  # the first frame: the timeline's slot 0
        if self._ahead_s(now) >= MAX_AHEAD_S:
            self.packets_dropped += 1  # faster than real time: a backlog no caller makes
            return
        rate = frame.sample_rate
        if rate != self._in_rate:
            self._switch_rate(rate)
        pts = _pts_in_samples(frame)
        if self._silent and len(self._pending) < self.frame_bytes:
            self._next_pts = None  # the pause was given as silence: nothing to fill
        if pts is not None and self._next_pts is not None:
            if pts + samples.size <= self._next_pts:
                self.packets_dropped += 1
                return
            if pts < self._next_pts:  # overlaps what was already played: keep only the new part
                samples = samples[self._next_pts - pts :]
                pts = self._next_pts
            gap = pts - self._next_pts
            if gap > MAX_GAP_S * rate or gap > (MAX_AHEAD_S - self._ahead_s(now)) * rate:
                self.discontinuities += 1
            elif gap > 0:
                self._conceal(gap, samples.size)
        self.packets_received += 1
        self.last_packet_at = now
        self._next_pts = None if pts is None else pts + samples.size
        self._last = samples
        self._push(samples)

    def _ahead_s(self, now: float) -> float:
        """How far the timeline (given and pending audio) runs ahead of the wall clock."""
        if self._anchor is None:
            return 0.0
        made = self._played * FRAME_MS / 1000 + len(self._pending) / (2 * self.rate)
        return made - (now - self._anchor)

    def _switch_rate(self, rate: int) -> None:
        if self._resampler is not None:
            self._emit_resampled(self._resampler.flush())
        self._in_rate = rate
        self._resampler = StreamResampler(rate, self.rate)
        self._next_pts = None
        self._last = None

    def _conceal(self, gap: int, frame_size: int) -> None:
        """Fill `gap` input samples: the last frame repeated, fading to silence."""
        size = self._last.size if self._last is not None else frame_size
        self.packets_lost += round(gap / max(1, size))  # a sub-frame slip is filled, not lost
        fill = np.zeros(gap, dtype=np.int16)
        fade = min(gap, self._in_rate * CONCEAL_MS // 1000)
        if self._last is not None and fade > 0:
            repeats = -(-fade // self._last.size)
            echo = np.tile(self._last, repeats)[:fade].astype(np.float32)
            gain = np.linspace(0.9, 0.0, fade, endpoint=False, dtype=np.float32)
            fill[:fade] = (echo * gain).astype(np.int16)
        self._concealed_s += gap / self._in_rate
        self.concealed_ms = round(self._concealed_s * 1000)
        self._push(fill)

    def _push(self, samples: Int16Array) -> None:
        assert self._resampler is not None
        self._emit_resampled(self._resampler.process(samples))

    def _emit_resampled(self, samples: Int16Array) -> None:
        if samples.size:
            self._pending.extend(samples.astype("<i2", copy=False).tobytes())

"""The caller's WebRTC audio track -> exact 20 ms PCM16 mono frames at the engines' rate.

aiortc's receiver reorders packets (its jitter buffer) and decodes Opus to s16 stereo 48 kHz
frames whose pts (time base 1/48000) follow the RTP timestamps, but it does not conceal loss:
a lost packet is only a jump in pts. This reader keeps the audio timeline exact: a gap is
filled (the last frame repeated, fading out over CONCEAL_MS, then silence) and counted, late or
duplicate frames are dropped and counted, and the audio is downmixed and resampled once with a
streaming soxr resampler, so VAD and ASR see the same time as the caller spoke.

The pts are the caller's to choose: a hostile peer could jump them ~MAX_GAP_S on every
packet and have one 20 ms packet filled with seconds of audio for the session to hear. So
the timeline made here (real audio and fill) may run at most MAX_AHEAD_S ahead of the wall
clock since the first frame; a gap that would go further is a discontinuity (not filled).
An honest caller's timeline never runs ahead but by the backlog of frames read late.
"""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np
from aiortc import RTCRtpReceiver
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from voxserve.audio.pcm import Int16Array
from voxserve.audio.resample import StreamResampler
from voxserve.server.webrtc_jitter import AudioJitterBuffer, use_audio_jitter_buffer

FRAME_MS = 20
CONCEAL_MS = 60  # a lost stretch longer than this is silence after the fade-out
MAX_GAP_S = 10.0  # a larger pts jump is a discontinuity (the peer reset its clock): not filled
MAX_AHEAD_S = 2.0  # how far the filled timeline may run ahead of the wall clock (docstring)


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
    """Reads a remote audio track as 20 ms PCM16 frames; counts loss and concealment.

    One task reads (read() pulls the track as it needs frames). packets_lost counts pts gaps
    in packets of the last frame's size: a peer using DTX (no packets in silence) would read
    as loss; browsers do not enable Opus DTX unless the SDP asks for it.

    Given the track's `receiver` (before media flows: at the "track" event), it also puts an
    AudioJitterBuffer in it in place of aiortc's, which loses ~5 frames per lost packet.
    """

    def __init__(
        self,
        track: MediaStreamTrack,
        *,
        rate: int = 16_000,
        receiver: RTCRtpReceiver | None = None,
    ) -> None:
        self.track = track
        self.jitter: AudioJitterBuffer | None = (
            None if receiver is None else use_audio_jitter_buffer(receiver)
        )
        self.rate = rate
        self.frame_bytes = rate * FRAME_MS // 1000 * 2
        self.packets_received = 0
        self.packets_lost = 0
        self.packets_dropped = 0  # late, duplicate or backwards frames
        self.discontinuities = 0  # pts jumps beyond MAX_GAP_S or the clock: not filled
        self.concealed_ms = 0
        self.last_packet_at = time.monotonic()
        self._first_at: float | None = None  # time.monotonic() of the first frame accepted
        self._made_s = 0.0  # seconds of audio made since (real and filled)
        self._concealed_s = 0.0
        self._in_rate = 0
        self._resampler: StreamResampler | None = None
        self._next_pts: int | None = None  # expected pts of the next frame, in input samples
        self._last: Int16Array | None = None  # last real frame (mono, input rate)
        self._pending = bytearray()
        self._ended = False

    @property
    def last_heard_at(self) -> float:
        """time.monotonic() of the caller's last packet as it came off the network (its
        jitter buffer's, when installed), not as read(): a session slow to read is not a
        silent caller. `last_packet_at` without the buffer."""
        if self.jitter is None:
            return self.last_packet_at
        return max(self.jitter.last_packet_at, self.last_packet_at)

    @property
    def ended(self) -> bool:
        return self._ended and len(self._pending) == 0

    async def read(self) -> bytes | None:
        """The next 20 ms frame; None once the track ended (the tail is padded to 20 ms)."""
        while len(self._pending) < self.frame_bytes:
            if self._ended:
                if not self._pending:
                    return None
                self._pending.extend(bytes(self.frame_bytes - len(self._pending)))
                break
            try:
                frame = await self.track.recv()
            except MediaStreamError:
                self._end()
                continue
            if isinstance(frame, AudioFrame):
                self._accept(frame)
        out = bytes(self._pending[: self.frame_bytes])
        del self._pending[: self.frame_bytes]
        return out

    def _end(self) -> None:
        self._ended = True
        if self._resampler is not None:
            self._emit_resampled(self._resampler.flush())

    def _accept(self, frame: AudioFrame) -> None:
        samples = mono_samples(frame)
        if samples.size == 0:
            return
        rate = frame.sample_rate
        if rate != self._in_rate:
            self._switch_rate(rate)
        pts = _pts_in_samples(frame)
        if pts is not None and self._next_pts is not None:
            if pts + samples.size <= self._next_pts:
                self.packets_dropped += 1
                return
            if pts < self._next_pts:  # overlaps what was already played: keep only the new part
                samples = samples[self._next_pts - pts :]
                pts = self._next_pts
            gap = pts - self._next_pts
            if gap > MAX_GAP_S * rate or gap > self._fill_allowed_s() * rate:
                self.discontinuities += 1
            elif gap > 0:
                self._conceal(gap, samples.size)
        self.packets_received += 1
        self.last_packet_at = time.monotonic()
        if self._first_at is None:
            self._first_at = self.last_packet_at
        self._next_pts = None if pts is None else pts + samples.size
        self._last = samples
        self._push(samples)

    def _fill_allowed_s(self) -> float:
        """The longest gap that may be filled now: the timeline stays within MAX_AHEAD_S of
        the wall clock since the first frame."""
        if self._first_at is None:
            return MAX_AHEAD_S
        return time.monotonic() - self._first_at + MAX_AHEAD_S - self._made_s

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
        self._made_s += samples.size / self._in_rate
        self._emit_resampled(self._resampler.process(samples))

    def _emit_resampled(self, samples: Int16Array) -> None:
        if samples.size:
            self._pending.extend(samples.astype("<i2", copy=False).tobytes())

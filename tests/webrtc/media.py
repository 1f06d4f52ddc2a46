"""Synthetic audio for the WebRTC media tests: decoded frames as aiortc's receiver gives them."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import numpy.typing as npt
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame


class FramesTrack(MediaStreamTrack):
    """A remote track that yields the given frames, then ends as aiortc's does."""

    kind = "audio"

    def __init__(self, frames: list[AudioFrame]) -> None:
        super().__init__()
        self._frames = list(frames)

    async def recv(self) -> AudioFrame:
        if not self._frames:
            self.stop()
            raise MediaStreamError
        return self._frames.pop(0)


def tone(
    freq: float, samples: int, rate: int = 48_000, start: int = 0, amp: float = 0.5
) -> npt.NDArray[np.int16]:
    t = (np.arange(samples) + start) / rate
    return (np.sin(2 * np.pi * freq * t) * amp * 32767).astype(np.int16)


def stereo_frame(
    left: npt.NDArray[np.int16], right: npt.NDArray[np.int16], pts: int, rate: int = 48_000
) -> AudioFrame:
    """An s16 packed stereo frame, pts in 1/rate: the Opus decoder's output."""
    interleaved = np.stack([left, right], axis=1).reshape(1, -1)
    frame = AudioFrame.from_ndarray(interleaved, format="s16", layout="stereo")
    frame.sample_rate = rate
    frame.time_base = Fraction(1, rate)
    frame.pts = pts
    return frame


def tone_frames(
    freq: float, count: int, size: int = 960, skip: frozenset[int] = frozenset()
) -> list[AudioFrame]:
    """`count` consecutive frames of a tone; the indexes in `skip` are lost (a pts gap)."""
    frames = []
    for i in range(count):
        if i in skip:
            continue
        mono = tone(freq, size, start=i * size)
        frames.append(stereo_frame(mono, mono, pts=i * size))
    return frames


def peak_hz(pcm: bytes, rate: int) -> float:
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    return float(np.fft.rfftfreq(samples.size, 1 / rate)[int(np.argmax(spectrum))])


def rms(pcm: bytes) -> float:
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    return float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0

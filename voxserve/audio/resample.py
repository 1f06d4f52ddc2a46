"""Sample-rate conversion with soxr, one-shot or streaming (state carried per stream)."""

from __future__ import annotations

import numpy as np
import soxr

from voxserve.audio.pcm import Int16Array
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.types import SUPPORTED_INPUT_RATES


def check_rate(rate: int, supported: tuple[int, ...] = SUPPORTED_INPUT_RATES) -> int:
    if rate not in supported:
        listed = ", ".join(str(r) for r in supported)
        raise VoxError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"sample rate {quoted(rate)} is not supported; use one of {listed}",
        )
    return rate


def resample(samples: Int16Array, from_rate: int, to_rate: int) -> Int16Array:
    """Resample a whole buffer (uploads, TTS replies)."""
    if from_rate == to_rate or samples.size == 0:
        return samples
    out: Int16Array = soxr.resample(samples, from_rate, to_rate, quality="HQ")
    return out


class StreamResampler:
    """Resamples a live stream chunk by chunk; the filter state is carried between calls."""

    def __init__(self, from_rate: int, to_rate: int) -> None:
        self.from_rate = from_rate
        self.to_rate = to_rate
        self._stream = (
            None
            if from_rate == to_rate
            else soxr.ResampleStream(from_rate, to_rate, 1, dtype="int16", quality="HQ")
        )
        self.passthrough = self._stream is None  # read per frame: an attribute

    def process(self, samples: Int16Array, *, last: bool = False) -> Int16Array:
        if self._stream is None:
            return samples
        out: Int16Array = self._stream.resample_chunk(samples, last=last)
        return out

    def flush(self) -> Int16Array:
        if self._stream is None:
            return np.zeros(0, dtype=np.int16)
        return self.process(np.zeros(0, dtype=np.int16), last=True)

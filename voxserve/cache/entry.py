"""One cached reply, as held in memory and stored on disk."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from voxserve.audio.pcm import Int16Array


def checksum(pcm: bytes) -> int:
    """crc32 of the audio: what a torn or corrupted row fails (zlib's runs at GB/s)."""
    return zlib.crc32(pcm)


@dataclass(frozen=True, slots=True)
class Entry:
    """A finished reply: 16-bit little-endian mono PCM at `sample_rate`. Times are wall-clock
    seconds (epoch), so expiry survives a restart."""

    key: str
    voice: str
    text_norm: str
    sample_rate: int
    pcm: bytes
    created: float
    expires: float

    @property
    def nbytes(self) -> int:
        return len(self.pcm)

    def samples(self) -> Int16Array:
        """A read-only view of the audio, no copy (hits are split from it)."""
        return np.frombuffer(self.pcm, dtype="<i2")

"""One cached reply, as held in memory and stored on disk: its PCM and the encodings of it
made so far (mp3, opus, ... : `variants`), which live and die with it."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from voxserve.audio.pcm import Int16Array


def checksum(pcm: bytes) -> int:
    """crc32 of the audio: what a torn or corrupted row fails (zlib's runs at GB/s)."""
    return zlib.crc32(pcm)


_NO_VARIANTS: Mapping[str, bytes] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Entry:
    """A finished reply: 16-bit little-endian mono PCM at `sample_rate`. Times are wall-clock
    seconds (epoch), so expiry survives a restart. `variants`: encoded forms of `pcm` by
    variant name (audio/encode.py `variant_name`: format, codec settings, rate); they weigh
    in the entry's bytes, so one LRU bounds audio and encodings together."""

    key: str
    voice: str
    text_norm: str
    sample_rate: int
    pcm: bytes
    created: float
    expires: float
    variants: Mapping[str, bytes] = field(default_factory=lambda: _NO_VARIANTS)

    @property
    def nbytes(self) -> int:
        """What the entry weighs in the cache's bound: the PCM and every variant."""
        return len(self.pcm) + sum(len(data) for data in self.variants.values())

    def with_variant(self, name: str, data: bytes) -> Entry:
        """The same entry, one variant more (entries are immutable: the LRU re-weighs it)."""
        return replace(self, variants=MappingProxyType({**self.variants, name: data}))

    def samples(self) -> Int16Array:
        """A read-only view of the audio, no copy (hits are split from it)."""
        return np.frombuffer(self.pcm, dtype="<i2")

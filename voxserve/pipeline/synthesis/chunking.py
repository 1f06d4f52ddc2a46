"""Adaptive TTS output chunks: a small first chunk, then chunks as long as the lead.

The first chunk decides time to first audio, so it is short (`tts.first_chunk_ms`). After
that a client has as much audio buffered as was already sent, less what it played; a chunk
no longer than the audio sent before it (capped at `tts.max_chunk_ms`) can therefore never
be what the player is waiting for, while larger chunks mean fewer messages and executor hops.
Sizes depend only on what was sent, never on the clock, so a cache hit and a miss of the same
text are cut by the same rule (a miss also cuts where the engine's own chunks end).
"""

from __future__ import annotations

from collections.abc import Iterator

from voxserve.audio.pcm import Int16Array
from voxserve.config import TtsConfig


class Chunker:
    """Cuts one stream's audio into chunks; keep one per stream (it counts what was sent)."""

    def __init__(self, first_samples: int, max_samples: int) -> None:
        self.max_samples = max(1, max_samples)
        self.first_samples = max(1, min(first_samples, self.max_samples))
        self.sent = 0  # samples handed out so far

    def next_size(self) -> int:
        """The longest chunk allowed next: the first size, then the lead, up to the cap."""
        if self.sent == 0:
            return self.first_samples
        return min(self.max_samples, max(self.first_samples, self.sent))

    def split(self, samples: Int16Array) -> Iterator[Int16Array]:
        start = 0
        while start < samples.size:
            size = self.next_size()
            piece = samples[start : start + size]
            start += piece.size
            self.sent += piece.size
            yield piece


def chunk_sizes(tts: TtsConfig, sample_rate: int) -> tuple[int, int]:
    """(first, max) chunk lengths in samples at `sample_rate`, from the settings."""
    first = max(1, sample_rate * tts.first_chunk_ms // 1000)
    return first, max(1, sample_rate * tts.max_chunk_ms // 1000)

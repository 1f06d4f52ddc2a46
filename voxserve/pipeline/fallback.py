"""The phrase a live reply speaks instead of uncached speech while TTS is degraded.

Made at start-up for every voice (speed 1, the default output rate), through the cache (so a
restart finds it there), and kept here too, apart from the LRU: eviction, TTL or an
invalidation can never leave a degraded server with nothing to say. Other output rates are
resampled from it once and kept (at most voices x supported rates).
"""

from __future__ import annotations

import logging

from voxserve.audio.pcm import Int16Array
from voxserve.audio.resample import resample

log = logging.getLogger(__name__)


class FallbackPhrase:
    def __init__(self, text: str | None) -> None:
        self.text = text.strip() if text and text.strip() else None
        self._audio: dict[tuple[str, int], Int16Array] = {}
        self._made: dict[str, tuple[int, Int16Array]] = {}  # voice -> (rate, samples)

    def add(self, voice: str, rate: int, samples: Int16Array) -> None:
        self._made[voice] = (rate, samples)
        self._audio[(voice, rate)] = samples

    @property
    def voices(self) -> list[str]:
        return list(self._made)

    def audio(self, voice: str, rate: int) -> Int16Array | None:
        """The phrase in `voice` at `rate`; None if there is none for that voice."""
        found = self._audio.get((voice, rate))
        if found is None:
            made = self._made.get(voice)
            if made is None:
                return None
            found = self._audio[(voice, rate)] = resample(made[1], made[0], rate)
        return found

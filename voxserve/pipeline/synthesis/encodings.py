"""Encoded replies kept beside their PCM in the TTS cache (cache/entry.py variants).

HTTP speech's default format is mp3 (OpenAI's); encoding a cached reply again on every
hit cost more than the hit itself (docs/benchmarks.md "Speech cache hits"). A request in
a compressed format looks for its encoding first (`cached`); without one, the reply is
made (from the cached PCM or by synthesis, streamed as always) and its encoding is kept
when it completes (`keep`). The PCM's key already holds text, voice, speed, rate, engine
and scope; the variant's name adds the format and codec settings (audio/encode.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from voxserve.audio.encode import variant_name
from voxserve.cache.key import SHARED_SCOPE, CacheKey
from voxserve.cache.tts_cache import TtsCache
from voxserve.pipeline.context import SpeechContext
from voxserve.pipeline.synthesis.request import cache_key, plan


@dataclass(frozen=True, slots=True)
class EncodedReply:
    """A reply's whole encoding, and how many samples of audio it holds."""

    data: bytes
    samples: int


class Encodings:
    """The encoding `name` of one request's reply, looked up and kept under its keys: the
    caller's scope first, then the shared one (prewarmed phrases), as PCM lookups do."""

    def __init__(self, ctx: SpeechContext, cache: TtsCache, keys: list[CacheKey], name: str):
        self._ctx = ctx
        self._cache = cache
        self._keys = keys
        self.name = name
        self.max_bytes = ctx.settings.cache.max_entry_bytes  # more is never kept

    @classmethod
    def of(
        cls,
        ctx: SpeechContext,
        text: str,
        *,
        voice: str | None,
        speed: float,
        sample_rate: int,
        response_format: str,
        scope: str = SHARED_SCOPE,
    ) -> Encodings | None:
        """None when caching is off or the format needs no encoder (wav, pcm)."""
        cache = ctx.speech.cache
        name = variant_name(response_format, sample_rate)
        if cache is None or name is None:
            return None
        request = plan(ctx, text, voice, speed, sample_rate)
        fingerprints = ctx.speech.fingerprints
        keys = [cache_key(fingerprints, request, scope)]
        if scope != SHARED_SCOPE:
            keys.append(cache_key(fingerprints, request))
        return cls(ctx, cache, keys, name)

    def cached(self) -> EncodedReply | None:
        """The kept encoding, counted as a cache hit (first audio `hit`, work class bulk:
        a one-shot request); None otherwise."""
        started = time.perf_counter()
        for key in self._keys:
            found = self._cache.lookup_variant(key, self.name)
            if found is not None:
                entry, data = found
                elapsed = time.perf_counter() - started
                self._ctx.metrics.observe_first_audio("hit", elapsed, "bulk")  # HTTP only
                return EncodedReply(data, len(entry.pcm) // 2)
        return None

    def keep(self, data: bytes, samples: int) -> None:
        """Keep a complete encoding of `samples` of audio beside its PCM, if that is cached
        (a reply too long to cache, or invalidated meanwhile, keeps nothing)."""
        for key in self._keys:
            if self._cache.add_variant(key.digest, self.name, data, samples * 2):
                return

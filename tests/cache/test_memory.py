"""The in-memory side of the cache: bounded by bytes with LRU eviction, TTL with jitter on a
virtual clock, invalidation. No disk here (the cache is not loaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cache.helpers import Clock, key, pcm, tts_cache
from voxserve.cache.tts_cache import TtsCache


def memory_cache(tmp_path: Path, clock: Clock | None = None, **config: object) -> TtsCache:
    return tts_cache(tmp_path, clock, seed=7, **config)


def test_eviction_is_by_bytes_least_recently_used_first(tmp_path: Path) -> None:
    cache = memory_cache(tmp_path, max_bytes=1000, max_entry_bytes=1000)
    a, b, c, big = key("a"), key("b"), key("c"), key("big")
    cache.store(a, pcm(400))
    cache.store(b, pcm(400))
    assert cache.lookup(a) is not None  # a is now more recent than b
    cache.store(c, pcm(400))  # 1200 > 1000: the least recently used (b) goes
    assert cache.lookup(b) is None
    assert cache.lookup(a) is not None and cache.lookup(c) is not None
    assert cache.lru.bytes == 800 and cache.evictions == 1
    cache.store(big, pcm(900))  # one large reply weighs as much as two: both go
    assert len(cache.lru) == 1 and cache.lru.bytes == 900 and cache.evictions == 3
    assert cache.stats().bytes <= 1000


def test_a_reply_over_max_entry_bytes_is_not_kept(tmp_path: Path) -> None:
    cache = memory_cache(tmp_path, max_bytes=10_000, max_entry_bytes=1000)
    assert cache.store(key("long"), pcm(1002)) is None
    assert cache.store(key("empty"), b"") is None
    assert cache.lookup(key("long")) is None
    assert cache.stats().not_cached == 2 and len(cache.lru) == 0


def test_ttl_has_jitter_so_entries_do_not_expire_together(tmp_path: Path) -> None:
    clock = Clock()
    cache = memory_cache(tmp_path, clock, ttl_s=100.0, jitter=0.2)
    keys = [key(f"sentence {i}") for i in range(200)]
    for k in keys:
        cache.store(k, pcm(64))
    lifetimes = [e.expires - e.created for e in (cache.lru.get(k.digest) for k in keys) if e]
    assert len(lifetimes) == 200
    assert all(80.0 <= life <= 120.0 for life in lifetimes)  # ttl +- 20%
    assert max(lifetimes) - min(lifetimes) > 30.0  # spread over the window, not one instant

    clock.advance(79.9)
    assert cache.sweep() == 0  # nothing expires before ttl - 20%
    clock.advance(100.0 - 79.9)
    expired_at_ttl = cache.sweep()
    assert 40 <= expired_at_ttl <= 160  # about half at the nominal ttl, not all at once
    clock.advance(20.1)
    assert all(cache.lookup(k) is None for k in keys)  # everything by ttl + 20%
    assert cache.stats().expirations == 200 and cache.stats().entries == 0


def test_an_expired_entry_is_never_served_even_before_a_sweep(tmp_path: Path) -> None:
    clock = Clock()
    cache = memory_cache(tmp_path, clock, ttl_s=10.0, jitter=0.0)
    k = key("short lived")
    cache.store(k, pcm(64))
    clock.advance(9.99)
    assert cache.lookup(k) is not None
    clock.advance(0.02)
    assert cache.lookup(k) is None and cache.expirations == 1 and cache.hits == 1


def test_invalidation_by_voice_by_prefix_both_and_all(tmp_path: Path) -> None:
    cache = memory_cache(tmp_path)
    texts = ["Hello world.", "Hello there.", "Goodbye now."]
    for voice in ("joe", "amy"):
        for text in texts:
            cache.store(key(text, voice=voice), pcm(64))
    assert cache.invalidate(voice="amy") == 3
    assert all(cache.lookup(key(t, voice="joe")) for t in texts)
    assert cache.invalidate(text_prefix="  Hello   wor") == 1  # normalised like the texts
    assert cache.lookup(key("Hello world.", voice="joe")) is None
    assert cache.lookup(key("Hello there.", voice="joe")) is not None
    cache.store(key("Hello again.", voice="amy"), pcm(64))
    assert cache.invalidate(voice="joe", text_prefix="Hello") == 1  # both must match
    assert cache.lookup(key("Hello again.", voice="amy")) is not None
    assert cache.clear() == 2 and len(cache.lru) == 0 and cache.lru.bytes == 0
    assert cache.stats().invalidated == 7
    with pytest.raises(ValueError, match="say what"):
        cache.invalidate()

"""What the cache tests share: a virtual clock, keys, audio and caches made to order, a loaded
runtime with fake engines and a private cache directory."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np

from tests.fakes import FakeTts, fake_runtime
from voxserve.cache.key import CacheKey, EngineFingerprint, make_key
from voxserve.cache.tts_cache import TtsCache
from voxserve.config import CacheConfig, DegradeConfig, Settings, load_settings
from voxserve.runtime import Runtime
from voxserve.types import EngineInfo

ENGINE = EngineFingerprint.of(EngineInfo("tts", "fake", "tests", "1.0", "n/a", model="m"))


class Clock:
    """Wall-clock seconds that only move when a test says so."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def key(text: str, voice: str = "fake", rate: int = 16_000) -> CacheKey:
    return make_key(text, voice=voice, speed=1.0, sample_rate=rate, engine=ENGINE)


def pcm(nbytes: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return rng.integers(-30000, 30000, nbytes // 2, dtype=np.int16).astype("<i2").tobytes()


def cache_settings(
    directory: Path, *, degrade: dict[str, Any] | None = None, **cache: Any
) -> Settings:
    """Default settings with the cache in `directory`; no fallback phrase unless `degrade`
    says so (so a FakeTts counts only the test's own syntheses)."""
    settings = load_settings(log_level="warning")
    tts = settings.tts.model_copy(
        update={"degrade": DegradeConfig(**({"fallback_text": None} | (degrade or {})))}
    )
    return settings.model_copy(update={"cache": CacheConfig(dir=directory, **cache), "tts": tts})


def tts_cache(directory: Path, clock: Clock | None = None, *, seed: int, **config: Any) -> TtsCache:
    """A cache in `directory`, not loaded, on a virtual clock; `seed` draws its TTL jitter."""
    return TtsCache(
        CacheConfig(dir=directory, **config), clock=clock or Clock(), rng=random.Random(seed)
    )


async def loaded_runtime(settings: Settings, tts: FakeTts) -> Runtime:
    runtime = fake_runtime(settings, tts=tts)
    await runtime.load()
    return runtime

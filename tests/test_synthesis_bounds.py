"""The synthesis path's bounds with a fake engine (the pipeline, not a model): a stage timeout
or a cancelled request stops the engine after the piece in progress, with the TTS cache and
without; the memory guard refuses new syntheses (not cache hits) and new requests, counted;
text with nothing to say never reaches the engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.cache.helpers import cache_settings
from tests.fakes import FakeTts, fake_runtime, tone
from tests.helpers import eventually
from voxserve.config import CacheConfig, LimitsConfig, Settings, StageConfig
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.scheduling.memory_guard import MemoryGuard, threshold_bytes
from voxserve.pipeline.synthesis.synthesize import first_audio, synthesize, synthesize_all
from voxserve.runtime import Runtime
from voxserve.server.session.admission import admit, admit_request

GB = 1 << 30


class PiecesTts(FakeTts):
    """One chunk per word, "slow" taking `slow_s`; counts the pieces started and whether
    the generator was closed (what stops the work)."""

    def __init__(self, slow_s: float) -> None:
        super().__init__(chunk_delay_s=0.01)
        self.slow_s = slow_s
        self.started = 0
        self.closed = 0

    def _words(self, text: str, speed: float, fail_at: int | None) -> Iterator[np.ndarray]:
        try:
            for word in text.split():
                self.started += 1
                time.sleep(self.slow_s if word == "slow" else self.chunk_delay_s)
                self.chunks_made += 1
                yield tone(300.0, 0.1)
        finally:
            self.closed += 1


def settings_for(tmp_path: Path, *, cached: bool, tts_timeout_s: float = 5.0) -> Settings:
    settings = cache_settings(tmp_path)
    pipeline = settings.pipeline.model_copy(
        update={"tts": StageConfig(concurrency=2, timeout_s=tts_timeout_s)}
    )
    cache = settings.cache if cached else CacheConfig(enabled=False)
    return settings.model_copy(update={"pipeline": pipeline, "cache": cache})


async def loaded(settings: Settings, tts: FakeTts) -> Runtime:
    runtime = fake_runtime(settings, tts=tts)
    await runtime.load()
    return runtime


async def settled(tts: PiecesTts, within_s: float = 3.0) -> int:
    """Pieces started once the generator is closed, and still so a moment later."""
    await eventually(lambda: tts.closed, within_s)
    made = tts.started
    await asyncio.sleep(0.3)
    assert tts.started == made, "the engine went on after the request ended"
    return made


@pytest.mark.parametrize("cached", [True, False], ids=["cache", "no_cache"])
async def test_a_stage_timeout_stops_the_engine_after_the_piece_in_progress(
    tmp_path: Path, cached: bool
) -> None:
    tts = PiecesTts(slow_s=0.6)
    runtime = await loaded(settings_for(tmp_path, cached=cached, tts_timeout_s=0.2), tts)
    text = "one two slow " + " ".join(f"w{i}" for i in range(50))
    try:
        with pytest.raises(VoxError) as caught:
            await synthesize_all(runtime, text)
        assert caught.value.code is ErrorCode.STAGE_TIMEOUT
        assert await settled(tts) == 3  # one, two, and the slow piece it was making
        assert tts.closed == 1
    finally:
        await runtime.aclose()


@pytest.mark.parametrize("cached", [True, False], ids=["cache", "no_cache"])
async def test_a_request_cancelled_mid_reply_stops_the_engine(tmp_path: Path, cached: bool) -> None:
    tts = PiecesTts(slow_s=0.3)
    runtime = await loaded(settings_for(tmp_path, cached=cached), tts)
    text = "one two slow " + " ".join(f"w{i}" for i in range(50))

    async def listen() -> None:
        async for _ in synthesize(runtime, text):
            pass

    try:
        task = asyncio.create_task(listen())
        await eventually(lambda: tts.started >= 3)
        task.cancel()  # a client gone, a barge-in
        await asyncio.gather(task, return_exceptions=True)
        assert await settled(tts) <= 4
    finally:
        await runtime.aclose()


async def test_nothing_speakable_never_reaches_the_engine(tmp_path: Path) -> None:
    tts = PiecesTts(slow_s=0.0)
    runtime = await loaded(settings_for(tmp_path, cached=True), tts)
    try:
        for text in ("....", "\u200b\u200d", "\x00\x07", "?! …"):
            with pytest.raises(VoxError) as caught:
                await first_audio(synthesize(runtime, text))
            assert caught.value.code is ErrorCode.EMPTY_TEXT
        assert tts.calls == []
    finally:
        await runtime.aclose()


def test_the_threshold_is_the_smaller_bound_shared_by_workers() -> None:
    limits = LimitsConfig(memory_guard_fraction=0.5, memory_guard_bytes=0)
    assert threshold_bytes(limits, ceiling=8 * GB) == 4 * GB
    assert threshold_bytes(limits, workers=4, ceiling=8 * GB) == GB
    both = LimitsConfig(memory_guard_fraction=0.5, memory_guard_bytes=GB)
    assert threshold_bytes(both, ceiling=8 * GB) == GB
    assert threshold_bytes(both, ceiling=0) == GB  # no ceiling known: the bytes only
    off = LimitsConfig(memory_guard_fraction=0, memory_guard_bytes=0)
    assert threshold_bytes(off, ceiling=8 * GB) == 0
    assert threshold_bytes(LimitsConfig()) > 0  # on by default, from this machine


def test_the_guard_refuses_over_its_threshold_only() -> None:
    rss = [900]
    guard = MemoryGuard(1000, retry_after_s=2, rss=lambda: rss[0])
    guard.check("request")
    rss[0] = 1001
    with pytest.raises(VoxError) as caught:
        guard.check("request")
    assert caught.value.code is ErrorCode.OVERLOADED and caught.value.retry_after_s == 2
    assert caught.value.fatal and "memory" in caught.value.message
    with pytest.raises(VoxError) as caught:
        guard.check("synthesis", fatal=False)
    assert not caught.value.fatal
    assert guard.refusals == {"request": 1, "synthesis": 1}
    guard.threshold = 0  # off
    guard.check("request")


async def test_over_the_threshold_new_work_is_refused_but_cached_speech_is_served(
    tmp_path: Path,
) -> None:
    tts = PiecesTts(slow_s=0.0)
    runtime = await loaded(settings_for(tmp_path, cached=True), tts)
    try:
        cached = await synthesize_all(runtime, "already said")
        runtime.memory_guard.threshold = 1  # far below any process's RSS
        for refuse in (lambda: admit_request(runtime), lambda: admit(runtime)):
            with pytest.raises(VoxError) as caught:
                refuse()
            assert caught.value.code is ErrorCode.OVERLOADED and caught.value.fatal
        with pytest.raises(VoxError) as caught:
            await synthesize_all(runtime, "something new")
        assert caught.value.code is ErrorCode.OVERLOADED and not caught.value.fatal
        assert np.array_equal(await synthesize_all(runtime, "already said"), cached)
        assert tts.calls == ["already said"]
        assert runtime.memory_guard.refusals == {"request": 1, "session": 1, "synthesis": 1}
        runtime.memory_guard.threshold = 1 << 50
        assert (await synthesize_all(runtime, "something new")).size
    finally:
        await runtime.aclose()

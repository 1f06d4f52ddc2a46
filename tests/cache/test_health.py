"""TTS health (when to serve only the cache) and prewarming that yields to live traffic."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.cache.helpers import cache_settings, loaded_runtime
from tests.fakes import FakeTts
from voxserve.cache.prewarm import PrewarmItem, expand
from voxserve.config import DegradeConfig
from voxserve.errors import ErrorCode
from voxserve.pipeline.scheduling.tts_health import TtsDegraded, TtsHealth
from voxserve.pipeline.synthesis.synthesize import synthesize_all


class Monotonic:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def health(clock: Monotonic, **config: object) -> TtsHealth:
    settings = {"first_audio_budget_ms": 200, "sustained_s": 2.0, "min_slow": 3}
    settings |= {"max_waiting": 8, "retry_after_s": 2} | config
    return TtsHealth(DegradeConfig(**settings), clock)  # type: ignore[arg-type]


def test_slow_first_audio_sustained_degrades_and_a_fast_one_recovers() -> None:
    clock = Monotonic()
    h = health(clock)
    for t in (0.0, 1.0):
        clock.now = t
        h.observe_first_audio(0.5)
    assert h.reason(0) is None  # slow, but not for 2 s yet
    clock.now = 2.0
    h.observe_first_audio(0.5)
    assert h.reason(0) == "slow"
    with pytest.raises(TtsDegraded) as refused:
        h.check(0)
    assert refused.value.code is ErrorCode.TTS_DEGRADED and refused.value.retry_after_s == 2
    h.observe_first_audio(0.05)  # one miss under budget: recovered at once
    assert h.reason(0) is None


def test_one_slow_miss_is_not_sustained() -> None:
    clock = Monotonic()
    h = health(clock)
    h.observe_first_audio(5.0)
    clock.now = 3.0
    h.observe_first_audio(5.0)  # two slow misses 3 s apart: fewer than min_slow
    assert h.reason(0) is None
    h.observe_first_audio(0.1)
    clock.now = 4.0
    h.observe_first_audio(5.0)
    assert h.reason(0) is None  # a fast miss broke the streak


def test_degraded_half_opens_after_retry_after_and_closes_on_the_next_slow_miss() -> None:
    clock = Monotonic()
    h = health(clock)
    for t in (0.0, 1.0, 2.0):
        clock.now = t
        h.observe_first_audio(0.5)
    clock.now = 3.9
    assert h.reason(0) == "slow"
    clock.now = 4.1  # no fresh evidence for retry_after_s: let uncached speech try again
    assert h.reason(0) is None
    h.observe_first_audio(0.5)  # still slow: degraded again at once
    assert h.reason(0) == "slow"


def test_a_long_queue_degrades_at_once_and_disabled_never_does() -> None:
    clock = Monotonic()
    assert health(clock).reason(8) == "queue"  # 8 already wait: a 9th is refused
    assert health(clock).reason(7) is None
    off = health(clock, enabled=False)
    for _ in range(5):
        off.observe_first_audio(9.0)
    clock.now = 10.0
    off.observe_first_audio(9.0)
    assert off.reason(100) is None


async def test_a_full_tts_queue_refuses_new_syntheses(tmp_path: Path) -> None:
    settings = cache_settings(tmp_path, degrade={"max_waiting": 1})
    pipeline = settings.pipeline.model_copy(
        update={"tts": settings.pipeline.tts.model_copy(update={"concurrency": 1})}
    )
    tts = FakeTts(chunk_delay_s=0.2)
    runtime = await loaded_runtime(settings.model_copy(update={"pipeline": pipeline}), tts)
    try:
        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(synthesize_all(runtime, f"request{i}")))
            await asyncio.sleep(0.02)  # arrivals spread out, as over a network
        results = await asyncio.gather(*tasks, return_exceptions=True)
        refused = [r for r in results if isinstance(r, TtsDegraded)]
        assert refused and all(r.reason == "queue" for r in refused)
        assert len(results) - len(refused) == 2  # one running + one waiting, no more
        assert len(tts.calls) == 2
    finally:
        await runtime.aclose()


def test_prewarm_lines_are_cached_whole_and_by_sentence() -> None:
    lines = ["# greetings", "", "Hello! How can I help you today?", "Goodbye.", "Goodbye."]
    assert expand(lines) == [
        "Hello! How can I help you today?",
        "Hello!",
        "How can I help you today?",
        "Goodbye.",
    ]


async def test_prewarm_yields_to_live_requests(tmp_path: Path) -> None:
    settings = cache_settings(tmp_path)
    pipeline = settings.pipeline.model_copy(
        update={"tts": settings.pipeline.tts.model_copy(update={"concurrency": 1})}
    )
    tts = FakeTts(chunk_delay_s=0.1)
    runtime = await loaded_runtime(settings.model_copy(update={"pipeline": pipeline}), tts)
    assert runtime.prewarmer is not None and runtime.cache is not None
    sentences = [f"prewarm {i} here" for i in range(6)]  # 6 x 3 x 100 ms = 1.8 s of TTS
    progress: list[tuple[int, int]] = []
    runtime.prewarmer.on_progress = lambda done, total: progress.append((done, total))
    try:
        runtime.prewarmer.submit([PrewarmItem(text) for text in sentences])
        await asyncio.sleep(0.25)
        started = time.perf_counter()
        await synthesize_all(runtime, "a live request now")  # 4 chunks of 100 ms
        live_s = time.perf_counter() - started
        # Its own 0.4 s plus at most the prewarm chunk already running; sharing the one TTS
        # slot chunk for chunk with the prewarm would take 0.8 s.
        assert live_s < 0.65, live_s
        await runtime.prewarmer.wait()
        assert progress[-1] == (6, 6) and runtime.cache.stats().prewarm_done == 6
        calls = len(tts.calls)
        for text in sentences:
            await synthesize_all(runtime, text)
        assert len(tts.calls) == calls and runtime.cache.stats().hits == 6
    finally:
        await runtime.aclose()


async def test_a_prewarm_file_is_worked_through_after_start_up(tmp_path: Path) -> None:
    faq = tmp_path / "faq.txt"
    faq.write_text("Welcome back.\n# a comment\nWe open at nine. We close at five.\n")
    tts = FakeTts()
    runtime = await loaded_runtime(cache_settings(tmp_path, prewarm_file=faq), tts)
    assert runtime.prewarmer is not None and runtime.cache is not None
    try:
        assert runtime.ready  # ready first: prewarming happens in the background
        await runtime.prewarmer.wait()
        stats = runtime.cache.stats()
        assert (stats.prewarm_total, stats.prewarm_done, stats.entries) == (4, 4, 4)
        await synthesize_all(runtime, "We close at five.")
        assert len(tts.calls) == 4 and runtime.cache.stats().hits == 1
    finally:
        await runtime.aclose()

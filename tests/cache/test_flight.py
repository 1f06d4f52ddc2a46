"""Single flight through the real synthesis path (fake engine, no server): one synthesis per
missing reply however many ask; leaving, cancelling and failing never cache a partial reply;
a hit streams like a miss."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from tests.cache.helpers import cache_settings, loaded_runtime
from tests.fakes import FakeTts
from voxserve.cache.flight import LEAD_CHUNKS
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.synthesis.synthesize import synthesize, synthesize_all
from voxserve.runtime import Runtime

MAX_CHUNK = 16_000 * 200 // 1000  # tts.max_chunk_ms at 16 kHz


async def runtime_with(tmp_path: Path, tts: FakeTts) -> Runtime:
    return await loaded_runtime(cache_settings(tmp_path), tts)


async def collect(chunks: AsyncIterator[np.ndarray]) -> list[np.ndarray]:
    return [chunk async for chunk in chunks]


async def test_twenty_concurrent_requests_synthesise_once(tmp_path: Path) -> None:
    tts = FakeTts(chunk_delay_s=0.01)
    runtime = await runtime_with(tmp_path, tts)
    text = "one two three four five six"
    try:
        results = await asyncio.gather(*(synthesize_all(runtime, text) for _ in range(20)))
        assert tts.calls == [text]  # one synthesis for twenty requests
        assert all(np.array_equal(r, results[0]) for r in results) and results[0].size == 9600
        stats = runtime.cache.stats() if runtime.cache else None
        assert stats is not None and (stats.misses, stats.coalesced, stats.hits) == (1, 19, 0)
        again = await synthesize_all(runtime, text)
        assert np.array_equal(again, results[0]) and tts.calls == [text]  # now a hit
    finally:
        await runtime.aclose()


async def test_a_hit_streams_in_chunks_like_a_miss(tmp_path: Path) -> None:
    tts = FakeTts(seconds_per_word=0.45)  # 7200 samples per engine chunk: cut to <= 3200
    runtime = await runtime_with(tmp_path, tts)
    try:
        miss = await collect(synthesize(runtime, "a longer reply here"))
        hit = await collect(synthesize(runtime, "a  longer reply here "))
        assert len(tts.calls) == 1
        assert all(0 < c.size <= MAX_CHUNK for c in miss + hit)
        assert np.array_equal(np.concatenate(miss), np.concatenate(hit))
        assert len(hit) >= len(np.concatenate(hit)) // MAX_CHUNK  # streamed, not one blob
    finally:
        await runtime.aclose()


async def test_one_requester_leaving_does_not_stop_the_others(tmp_path: Path) -> None:
    tts = FakeTts(chunk_delay_s=0.03)
    runtime = await runtime_with(tmp_path, tts)
    text = " ".join(f"w{i}" for i in range(10))
    try:
        leaver = asyncio.create_task(collect(synthesize(runtime, text)))
        stayers = [asyncio.create_task(synthesize_all(runtime, text)) for _ in range(3)]
        await asyncio.sleep(0.1)
        leaver.cancel()
        results = await asyncio.gather(*stayers)
        assert all(r.size == 10 * 1600 for r in results)
        assert tts.calls == [text] and tts.chunks_made == 10
        assert (await synthesize_all(runtime, text)).size == 10 * 1600  # complete: cached
        assert tts.calls == [text]
    finally:
        await runtime.aclose()


async def test_when_every_requester_leaves_the_synthesis_stops_and_nothing_is_cached(
    tmp_path: Path,
) -> None:
    tts = FakeTts(chunk_delay_s=0.03)
    runtime = await runtime_with(tmp_path, tts)
    text = " ".join(f"w{i}" for i in range(30))
    try:
        readers = [asyncio.create_task(collect(synthesize(runtime, text))) for _ in range(2)]
        await asyncio.sleep(0.15)
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await asyncio.sleep(0.15)
        made = tts.chunks_made
        assert made < 30  # stopped between chunks
        await asyncio.sleep(0.15)
        assert tts.chunks_made == made
        assert runtime.cache is not None and runtime.cache.stats().in_flight == 0
        assert runtime.cache.stats().entries == 0  # a partial reply is never cached
        assert (await synthesize_all(runtime, text)).size == 30 * 1600
        assert tts.calls == [text, text]  # so the next request synthesises again
    finally:
        await runtime.aclose()


async def test_a_failed_synthesis_reaches_every_requester_and_is_not_cached(
    tmp_path: Path,
) -> None:
    tts = FakeTts(chunk_delay_s=0.01)
    tts.fail_at_word = 2
    runtime = await runtime_with(tmp_path, tts)
    text = "this one will fail halfway"
    try:
        results = await asyncio.gather(
            *(synthesize_all(runtime, text) for _ in range(5)), return_exceptions=True
        )
        assert all(isinstance(r, VoxError) for r in results)
        assert {r.code for r in results if isinstance(r, VoxError)} == {ErrorCode.ENGINE_ERROR}
        assert runtime.cache is not None and runtime.cache.stats().entries == 0
        tts.fail_at_word = None
        assert (await synthesize_all(runtime, text)).size == 5 * 1600
        assert tts.calls == [text, text]
    finally:
        await runtime.aclose()


async def test_a_reader_that_stops_reading_stops_the_engine(tmp_path: Path) -> None:
    tts = FakeTts()
    runtime = await runtime_with(tmp_path, tts)
    text = " ".join(f"w{i}" for i in range(60))
    try:
        chunks = synthesize(runtime, text)
        await anext(chunks)
        await asyncio.sleep(0.3)  # the engine is free; the reader is not reading
        assert tts.chunks_made <= LEAD_CHUNKS + 2  # bounded lead, not the whole reply
        await chunks.aclose()
    finally:
        await runtime.aclose()


async def test_a_reply_invalidated_while_in_flight_is_not_cached(tmp_path: Path) -> None:
    tts = FakeTts(chunk_delay_s=0.02)
    runtime = await runtime_with(tmp_path, tts)
    try:
        pending = asyncio.create_task(synthesize_all(runtime, "Hello from before the fix"))
        await asyncio.sleep(0.05)
        assert runtime.cache is not None
        runtime.cache.invalidate(text_prefix="Hello")
        assert (await pending).size == 5 * 1600  # the requester still gets its reply
        assert runtime.cache.stats().entries == 0
    finally:
        await runtime.aclose()


@pytest.mark.parametrize("rate", [8000, 24000])
async def test_each_output_rate_is_its_own_entry(tmp_path: Path, rate: int) -> None:
    tts = FakeTts()
    runtime = await runtime_with(tmp_path, tts)
    try:
        base = await synthesize_all(runtime, "same words")
        other = await synthesize_all(runtime, "same words", sample_rate=rate)
        assert other.size == pytest.approx(base.size * rate / 16000, abs=8)
        assert len(tts.calls) == 2
        assert (await synthesize_all(runtime, "same words", sample_rate=rate)).size == other.size
        assert len(tts.calls) == 2
    finally:
        await runtime.aclose()

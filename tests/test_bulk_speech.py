"""One-shot synthesis (HTTP speech) is bulk work on the TTS stage, which is work-conserving:
while no live reply waits, long texts streaming at once use every slot (both of two), and
the rest queue as bulk; `pipeline.tts.bulk_slots` (default one of two) is what they keep
while live work waits (pipeline/scheduling/stage.py, tests/test_stage_bulk.py)."""

from __future__ import annotations

import asyncio
import uuid

import httpx

from tests.conftest import LiveServer
from tests.fakes import FakeTts


async def test_long_http_texts_use_every_idle_tts_slot(fake_server: LiveServer) -> None:
    tts = fake_server.runtime.engines.tts[0]
    assert isinstance(tts, FakeTts)
    stage = fake_server.runtime.stages.stage("tts")
    assert (stage.concurrency, stage.bulk_slots, stage.work_conserving) == (2, 1, True)
    seen: list[tuple[int, int]] = []  # (bulk slots held, bulk callers waiting)

    async def speech(http: httpx.AsyncClient) -> httpx.Response:
        words = " ".join(f"w{uuid.uuid4().hex[:6]}" for _ in range(25))  # never cached
        body = {"input": words, "response_format": "pcm", "sample_rate": 16000}
        return await http.post("/v1/audio/speech", json=body)

    tts.chunk_delay_s = 0.02
    try:
        async with httpx.AsyncClient(base_url=fake_server.http_url, timeout=30) as http:
            replies = asyncio.gather(*(speech(http) for _ in range(3)))
            while not replies.done():
                seen.append((stage.bulk_held, stage.bulk_waiting))
                await asyncio.sleep(0.005)
            assert all(reply.status_code == 200 for reply in replies.result())
    finally:
        tts.chunk_delay_s = 0.0
    assert max(held for held, _ in seen) == 2  # both slots: no live reply waited
    assert any(waiting for _, waiting in seen)  # the others queued as bulk meanwhile

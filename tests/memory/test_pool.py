"""The session buffer pool on a real server: buffers are taken at session start and come
back at its end, an exhausted pool falls back to plain allocation with one WARNING naming
the session's trace id, and the usage ratio is exported."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import fake_runtime, silence, tone
from tests.wsclient import collect, of_type, send_audio, start
from voxserve.audio.pool import BufferPool, pool_buffers
from voxserve.audio.ring import SampleRing
from voxserve.config import PipelineConfig, load_settings

POOL = 2


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    settings = load_settings(port=free_port(), log_level="warning")
    settings = settings.model_copy(
        update={"pipeline": PipelineConfig(pool_buffers=POOL, ring_frames=64)}
    )
    live = start_server(settings, fake_runtime(settings))
    yield live
    stop_server(live)


def metric(server: LiveServer, name: str) -> float:
    for line in httpx.get(f"{server.http_url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


async def test_exhausted_pool_falls_back_with_one_warning_and_buffers_come_back(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    pool = server.runtime.pool
    assert pool.capacity == POOL
    caplog.set_level(logging.WARNING, logger="voxserve.audio.pool")
    freqs = [440.0, 660.0, 880.0]
    sockets = [await connect(server.ws_url) for _ in freqs]
    try:
        started = [
            await start(ws, mode="asr", trace_id=f"pool-test-{i}") for i, ws in enumerate(sockets)
        ]
        assert [s["type"] for s in started] == ["session.started"] * 3
        assert pool.in_use == POOL and pool.fallbacks == 1
        assert metric(server, "voxserve_pool_usage_ratio") == 1.0
        warnings = [r for r in caplog.records if r.name == "voxserve.audio.pool"]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
        assert warnings[0].__dict__["pool_trace_id"] == "pool-test-2"

        async def run(ws: ClientConnection, freq: float) -> list[dict[str, Any]]:
            audio = np.concatenate([silence(0.2), tone(freq, 0.8), silence(0.8)])
            await send_audio(ws, audio, speedup=4.0)
            await ws.send(json.dumps({"type": "audio.end"}))
            events, _ = await collect(ws)
            return events

        results = await asyncio.gather(*(run(ws, f) for ws, f in zip(sockets, freqs, strict=True)))
    finally:
        for ws in sockets:
            await ws.close()
    # Pooled and fallback sessions alike keep their own audio (the ring wraps: 64 frames).
    for events, freq in zip(results, freqs, strict=True):
        finals = of_type(events, "transcript.final")
        assert [f["text"] for f in finals] == [f"tone{round(freq / 10) * 10}"]
    for _ in range(50):
        if pool.in_use == 0:
            break
        await asyncio.sleep(0.02)
    assert pool.in_use == 0 and metric(server, "voxserve_pool_usage_ratio") == 0.0
    assert pool.peak == POOL


def test_sizing_rule_and_release_detaches_the_ring() -> None:
    settings = load_settings()
    assert pool_buffers(settings) == int(settings.limits.max_sessions * 1.2)
    pool = BufferPool(1, 640)
    first = pool.acquire("a")
    ring = SampleRing(640, first.samples)
    ring.write(np.full(320, 7, dtype=np.int16))
    ring.detach()  # the session ends: later writes must not reach the pooled buffer
    first.release()
    first.release()  # idempotent
    second = pool.acquire("b")
    assert second.pooled and np.shares_memory(second.samples, first.samples)
    assert ring.write(np.full(320, 9, dtype=np.int16)) == 0  # discarded, nothing allocated
    assert not np.any(second.samples == 9) and ring.read().size == 0
    assert pool.in_use == 1
    del second  # a session collected without having run gives its buffer back too
    assert pool.in_use == 0

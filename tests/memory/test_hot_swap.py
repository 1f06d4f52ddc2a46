"""Hot engine reload under load: live WebSocket streams finish on the engines they started
with, new streams use the new ones, and a retired generation is closed after its last stream.

The `load` engines are real registered engines (bench/load-engines.toml); each generation's
ASR answers with its own text ("gen1", "gen2", ...), so every transcript says which engines
produced it, as a changed model on disk would.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
import weakref
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import SecretStr
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import silence, tone
from tests.wsclient import collect, of_type, send_audio, start
from voxserve.config import EngineSpec, GcConfig, Settings, load_settings

ADMIN = "test-admin-key"
STREAMS = 8
RELOADS = 4
UTTERANCES = 3


def with_asr_text(settings: Settings, text: str) -> Settings:
    """The settings a reload reads, with the ASR engine answering `text`."""
    asr = EngineSpec(name="load", options={"text": text, "sleep_ms": 20})
    engines = settings.engines.model_copy(update={"asr": asr})
    return settings.model_copy(update={"engines": engines})


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    base = load_settings(
        "bench/load-engines.toml",
        port=free_port(),
        log_level="warning",
        admin_key=SecretStr(ADMIN),
    )
    # GC frozen after load as in production: the retired engines must still be freed.
    live = start_server(with_asr_text(base, "gen1").model_copy(update={"gc": GcConfig()}))
    yield live
    stop_server(live)


def speech() -> np.ndarray:
    parts = [silence(0.2)]
    for i in range(UTTERANCES):
        parts += [tone(300.0 + 100 * i, 0.6), silence(0.8)]
    return np.concatenate(parts)


async def one_stream(url: str, delay: float) -> dict[str, Any]:
    await asyncio.sleep(delay)
    async with connect(url) as ws:
        started = await start(ws, mode="asr")
        assert started["type"] == "session.started", started
        began = time.monotonic()
        await send_audio(ws, speech(), speedup=2.0)
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws, limit_s=30)
        return {"events": events, "began": began, "ended": time.monotonic()}


async def reloader(live: LiveServer, base: Settings) -> list[tuple[float, int]]:
    done: list[tuple[float, int]] = []
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(base_url=live.http_url, headers=headers, timeout=30) as http:
        for n in range(2, RELOADS + 2):
            await asyncio.sleep(0.6)
            live.runtime.settings = with_asr_text(base, f"gen{n}")  # "new model files"
            answer = await http.post("/admin/engines/reload", json={"kinds": ["asr"]})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["generation"] == n and body["previous"] == n - 1
            done.append((time.monotonic(), n))
    return done


async def test_reload_under_load_keeps_every_stream_on_its_engines(server: LiveServer) -> None:
    runtime = server.runtime
    first = weakref.ref(runtime.engines.asr)
    base = runtime.settings
    streams = [one_stream(server.ws_url, 0.35 * i) for i in range(STREAMS)]
    *results, reloads = await asyncio.gather(*streams, reloader(server, base))

    texts_seen = set()
    spanned = 0
    for result in results:
        events = result["events"]
        ended = events[-1]
        assert ended["type"] == "session.ended", events[-3:]
        assert not of_type(events, "error"), of_type(events, "error")
        assert ended["dropped"] == 0 and ended["processed"] == ended["received"]
        finals = of_type(events, "transcript.final")
        assert len(finals) == UTTERANCES, [f["text"] for f in finals]
        # Every result of a stream comes from the one generation it started on.
        texts = {e["text"] for e in [*finals, *of_type(events, "transcript.partial")]}
        assert len(texts) == 1, texts
        texts_seen |= texts
        if any(result["began"] < at < result["ended"] for at, _ in reloads):
            spanned += 1
    assert spanned >= STREAMS // 2  # reloads really happened while streams were live
    assert len(texts_seen) >= 3  # and new streams did start on the new engines

    # Retired generations are closed once their streams are over; only the current stays.
    deadline = time.monotonic() + 10
    while len(runtime.generations) > 1 and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    assert [g.number for g in runtime.generations] == [RELOADS + 1]
    assert runtime.generations[0].sessions == 0
    while first() is not None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # closed once no model call of theirs can be running
        gc.collect()
    assert first() is None  # the first ASR engine is gone from memory

    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{server.http_url}/metrics")).text
    assert f"voxserve_engine_generation {RELOADS + 1}.0" in metrics
    assert f'voxserve_engine_reloads_total{{outcome="ok"}} {RELOADS}.0' in metrics

    # A stream started now runs on the newest engines.
    last = await one_stream(server.ws_url, 0)
    assert {f["text"] for f in of_type(last["events"], "transcript.final")} == {f"gen{RELOADS + 1}"}


async def test_reload_needs_the_admin_key_and_valid_kinds(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        assert (await http.post("/admin/engines/reload")).status_code == 401
        headers = {"Authorization": f"Bearer {ADMIN}"}
        bad = await http.post("/admin/engines/reload", json={"kinds": ["gpu"]}, headers=headers)
        assert bad.status_code == 400 and "kinds" in bad.json()["error"]["message"]
        listing = (await http.get("/admin/engines", headers=headers)).json()
        assert listing["current"] == listing["generations"][-1]["generation"]

"""The cache in a real server (fake engines): it survives a restart, its admin routes and
`voxserve cache` commands work end to end, and a saturated TTS answers from the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from pydantic import SecretStr
from websockets.asyncio.client import connect

from tests.cache.helpers import cache_settings
from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeTts, fake_runtime
from tests.wsclient import collect, of_type, start
from voxserve.config import Settings

ADMIN_KEY = "test-admin-key"


def server_settings(directory: Path, **extra: object) -> Settings:
    settings = cache_settings(directory, **extra)  # type: ignore[arg-type]
    return settings.model_copy(update={"port": free_port(), "admin_key": SecretStr(ADMIN_KEY)})


def speak(live: LiveServer, text: str) -> httpx.Response:
    body = {"input": text, "response_format": "pcm", "sample_rate": 16000}
    return httpx.post(f"{live.http_url}/v1/audio/speech", json=body, timeout=30)


def admin(live: LiveServer, method: str, path: str, **kw: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    return httpx.request(method, f"{live.http_url}{path}", headers=headers, timeout=30, **kw)  # type: ignore[arg-type]


def test_a_restart_serves_the_same_audio_from_disk(tmp_path: Path) -> None:
    settings = server_settings(tmp_path)
    first_tts = FakeTts()
    live = start_server(settings, fake_runtime(settings, tts=first_tts))
    try:
        first = speak(live, "This reply outlives the server.")
        assert first.status_code == 200 and first_tts.calls
    finally:
        stop_server(live)
    assert not live.thread.is_alive()

    settings = settings.model_copy(update={"port": free_port()})
    second_tts = FakeTts()
    live = start_server(settings, fake_runtime(settings, tts=second_tts))
    try:
        stats = admin(live, "GET", "/admin/cache").json()
        assert stats["loaded_entries"] == 1 and stats["persistent"]
        again = speak(live, "This reply  outlives the server.")
        assert again.status_code == 200 and again.content == first.content  # byte for byte
        assert second_tts.calls == []  # served from the cache read back from disk
        assert admin(live, "GET", "/admin/cache").json()["hits"] == 1
    finally:
        stop_server(live)


@pytest.fixture(scope="module")
def cache_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = server_settings(tmp_path_factory.mktemp("cache-server"))
    live = start_server(settings, fake_runtime(settings, tts=FakeTts()))
    yield live
    stop_server(live)


def test_admin_routes_need_the_key(cache_server: LiveServer, tmp_path: Path) -> None:
    url = f"{cache_server.http_url}/admin/cache"
    missing = httpx.get(url)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "unauthorized"
    wrong = httpx.get(url, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    assert admin(cache_server, "GET", "/admin/cache").status_code == 200

    settings = cache_settings(tmp_path).model_copy(update={"port": free_port()})
    keyless = start_server(settings, fake_runtime(settings))
    try:
        refused = httpx.get(f"{keyless.http_url}/admin/cache")
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert error["code"] == "admin_disabled" and "VOXSERVE_ADMIN_KEY" in error["message"]
    finally:
        stop_server(keyless)


def test_admin_invalidate_prewarm_and_clear(cache_server: LiveServer) -> None:
    tts = cache_server.runtime.engines.tts[0]
    assert isinstance(tts, FakeTts)
    accepted = admin(
        cache_server,
        "POST",
        "/admin/cache/prewarm",
        json={"sentences": ["Admin one.", "Admin two. Admin three."]},
    )
    assert accepted.status_code == 202 and accepted.json()["accepted"] == 4
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stats = admin(cache_server, "GET", "/admin/cache").json()
        if stats["prewarm_done"] >= stats["prewarm_total"]:
            break
        time.sleep(0.05)
    calls = len(tts.calls)
    assert speak(cache_server, "Admin three.").status_code == 200  # cached by sentence
    assert len(tts.calls) == calls
    dropped = admin(
        cache_server, "POST", "/admin/cache/invalidate", json={"text_prefix": "Admin t"}
    )
    assert dropped.json() == {"invalidated": 3}
    bad = admin(cache_server, "POST", "/admin/cache/invalidate", json={})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_parameter"
    assert admin(cache_server, "DELETE", "/admin/cache").json()["cleared"] >= 1
    assert admin(cache_server, "GET", "/admin/cache").json()["entries"] == 0


def cli(*args: str, key: str | None = ADMIN_KEY) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXSERVE_")}
    if key is not None:
        env["VOXSERVE_ADMIN_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "voxserve", "cache", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_cache_commands_end_to_end(tmp_path: Path) -> None:
    directory = tmp_path / "cli-cache"
    settings = server_settings(directory)
    live = start_server(settings, fake_runtime(settings, tts=FakeTts()))
    url = ["--url", live.http_url]
    try:
        sentences = tmp_path / "faq.txt"
        sentences.write_text("# FAQ\nOpening hours are nine to five.\n\nWe are closed on Sunday.\n")
        done = cli("prewarm", str(sentences), *url)
        assert done.returncode == 0, done.stderr
        assert "queued 2 texts" in done.stdout and "prewarm 2/2" in done.stdout
        stats = cli("stats", "--json", *url)
        assert stats.returncode == 0 and json.loads(stats.stdout)["entries"] == 2
        offline = cli("stats", "--cache-dir", str(directory), key=None)  # read-only: allowed
        assert offline.returncode == 0 and "entries" in offline.stdout
        refused = cli("clear", "--cache-dir", str(directory), key=None)
        assert refused.returncode == 1 and "a server is using" in refused.stderr
        assert "Traceback" not in refused.stderr
        unauthorised = cli("stats", *url, key="wrong")
        assert unauthorised.returncode == 1 and "unauthorized" in unauthorised.stderr
        invalidated = cli("invalidate", "--text-prefix", "Opening", *url)
        assert invalidated.stdout.strip() == "invalidated 1 entries"
        assert cli("invalidate", *url).returncode == 2  # nothing said: a usage error
    finally:
        stop_server(live)
    cleared = cli("clear", "--cache-dir", str(directory), key=None)  # no server: allowed
    assert cleared.returncode == 0 and cleared.stdout.strip() == "cleared 1 entries"


async def test_saturated_tts_answers_from_the_cache(tmp_path: Path) -> None:
    degrade = {"first_audio_budget_ms": 100, "one_shot_first_audio_budget_ms": 100}
    # This test is about the slow-streak backstop, so admission by predicted lateness is
    # off (it would refuse as soon as the learnt rate predicts a miss), and the streak needs
    # all three slow misses (two, on a slow machine, can already span `sustained_s`).
    degrade |= {"sustained_s": 0.3, "min_slow": 3, "predict": False}
    degrade |= {"retry_after_s": 5, "fallback_text": "Please hold on."}
    settings = server_settings(tmp_path, degrade=degrade)
    tts = FakeTts()
    live = start_server(settings, fake_runtime(settings, tts=tts))
    try:
        async with httpx.AsyncClient(base_url=live.http_url, timeout=30) as http:

            async def speech(text: str) -> httpx.Response:
                body = {"input": text, "response_format": "pcm", "sample_rate": 16000}
                return await http.post("/v1/audio/speech", json=body)

            cached = await speech("Cached answer.")
            assert cached.status_code == 200
            tts.chunk_delay_s = 0.25  # TTS is now too slow: every miss misses the budget
            for word in ("slowone", "slowtwo", "slowthree"):
                assert (await speech(word)).status_code == 200
            refused = await speech("Something uncached.")
            assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
            assert refused.json()["error"]["code"] == "tts_degraded"
            hit = await speech("Cached answer.")  # hits are still served while degraded
            assert hit.status_code == 200 and hit.content == cached.content

            async with connect(live.ws_url) as ws:
                await start(ws, mode="tts")
                for text in ("Cached answer.", "Brand new words."):
                    await ws.send(json.dumps({"type": "text", "text": text, "flush": True}))
                await ws.send(json.dumps({"type": "session.end"}))
                events, audio = await collect(ws)
            fallback = of_type(events, "tts.fallback")
            assert len(fallback) == 1 and fallback[0]["reply"] == 1
            assert fallback[0]["reason"] == "slow" and fallback[0]["text"] == "Please hold on."
            ends = of_type(events, "tts.end")
            assert [e["interrupted"] for e in ends] == [False, False]
            assert ends[0]["audio_ms"] == 200 and ends[1]["audio_ms"] == 300  # 2 and 3 words
            samples = np.frombuffer(b"".join(audio), dtype="<i2")
            assert samples.size == (2 + 3) * 1600 and not of_type(events, "error")

            metrics = (await http.get("/metrics")).text
        assert "voxserve_tts_degraded 1.0" in metrics
        assert "voxserve_tts_fallbacks_total 1.0" in metrics
        assert 'voxserve_tts_first_audio_seconds_count{source="hit",work_class="live"}' in metrics
    finally:
        stop_server(live)

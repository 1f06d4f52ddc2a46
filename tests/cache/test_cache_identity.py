"""Cache identity in a real server (fake engines counting their syntheses): texts that are
spoken differently never share an entry, and with API keys each key is served only its own
entries and the operator's prewarmed ones (issue 28, class 3)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from websockets.asyncio.client import connect

from tests.cache.helpers import cache_settings
from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeTts, fake_runtime
from tests.wsclient import collect, start

ADMIN_KEY = "identity-admin-key"
KEY_A, KEY_B = "identity-key-a", "identity-key-b"
PREWARMED = "Welcome to the identity test."


def speak(live: LiveServer, text: str, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"input": text, "response_format": "pcm", "sample_rate": 16000}
    url = f"{live.http_url}/v1/audio/speech"
    return httpx.post(url, json=body, headers=headers, timeout=30)


def hits(live: LiveServer) -> int:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    stats = httpx.get(f"{live.http_url}/admin/cache", headers=headers, timeout=10).json()
    return int(stats["hits"])


def serve(tmp: Path, tts: FakeTts, *, keys: bool, **cache: object) -> LiveServer:
    prewarm = tmp / "prewarm.txt"
    prewarm.write_text(PREWARMED + "\n", encoding="utf-8")
    settings = cache_settings(tmp / "cache", prewarm_file=prewarm, **cache)
    update: dict[str, object] = {"port": free_port(), "admin_key": SecretStr(ADMIN_KEY)}
    if keys:
        update["api_keys"] = [SecretStr(KEY_A), SecretStr(KEY_B)]
    settings = settings.model_copy(update=update)
    live = start_server(settings, fake_runtime(settings, tts=tts))
    deadline = time.monotonic() + 20
    while PREWARMED not in tts.calls and time.monotonic() < deadline:
        time.sleep(0.05)
    assert PREWARMED in tts.calls
    return live


@pytest.fixture
def open_server(tmp_path: Path) -> Iterator[tuple[LiveServer, FakeTts]]:
    tts = FakeTts()
    live = serve(tmp_path, tts, keys=False)
    yield live, tts
    stop_server(live)


@pytest.mark.parametrize(
    ("first", "second"),
    [("10³", "103"), ("½", "1⁄2"), ("Ⅻ", "XII"), ("™", "TM"), ("ｈｅｌｌｏ", "hello")],
)
def test_texts_spoken_differently_are_each_synthesised(
    open_server: tuple[LiveServer, FakeTts], first: str, second: str
) -> None:
    live, tts = open_server
    for text in (f"Read {first} aloud.", f"Read {second} aloud."):
        assert speak(live, text).status_code == 200
        assert tts.calls[-1] == text  # a synthesis of its own, not the other's audio
    assert hits(live) == 0


def test_one_text_in_two_spellings_is_one_entry(open_server: tuple[LiveServer, FakeTts]) -> None:
    live, tts = open_server
    composed, decomposed = "Caf\u00e9 au lait.", "Cafe\u0301  au lait."
    assert speak(live, composed).status_code == 200
    made = len(tts.calls)
    again = speak(live, decomposed)
    assert again.status_code == 200 and len(tts.calls) == made and hits(live) == 1
    assert tts.calls[-1] == composed  # the engine was given the NFC form


async def _ws_say(live: LiveServer, key: str, text: str) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    async with connect(f"{live.ws_url}", additional_headers=headers) as ws:
        assert (await start(ws, mode="tts"))["type"] == "session.started"
        await ws.send(json.dumps({"type": "text", "text": text, "flush": True}))
        await ws.send(json.dumps({"type": "session.end"}))
        events, audio = await collect(ws)
    assert audio and events[-1]["type"] == "session.ended"


def test_each_key_is_served_only_its_own_entries(tmp_path: Path) -> None:
    tts = FakeTts()
    live = serve(tmp_path, tts, keys=True)
    try:
        text = "My account number ends in four two."
        asyncio.run(_ws_say(live, KEY_A, text))  # a live reply of key A, cached in A's scope
        made = len(tts.calls)
        assert speak(live, text, KEY_B).status_code == 200
        assert len(tts.calls) == made + 1 and hits(live) == 0  # B: synthesised anew
        assert speak(live, text, KEY_A).status_code == 200
        assert len(tts.calls) == made + 1 and hits(live) == 1  # A: its own entry
        for key in (KEY_A, KEY_B):  # the operator's prewarmed phrase serves every key
            assert speak(live, PREWARMED, key).status_code == 200
        assert tts.calls.count(PREWARMED) == 1 and hits(live) == 3
    finally:
        stop_server(live)


def test_sharing_across_keys_is_a_setting(tmp_path: Path) -> None:
    tts = FakeTts()
    live = serve(tmp_path, tts, keys=True, share_across_keys=True)
    try:
        text = "Shared between tenants."
        assert speak(live, text, KEY_A).status_code == 200
        assert speak(live, text, KEY_B).status_code == 200
        assert tts.calls.count(text) == 1 and hits(live) == 1
    finally:
        stop_server(live)

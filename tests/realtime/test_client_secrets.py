"""Realtime client secrets: POST /v1/realtime/client_secrets with the official `openai` SDK
against a real server (fake engines: these tests are about keys and session settings, not
speech), the `ek_` then used as the SDK's api_key for `client.realtime.connect`; and the
store itself (single use, expiry by its clock, the bound, two processes on one file)."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from pydantic import SecretStr
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, start_fake_server_in, stop_server
from tests.helpers import async_sdk, mint_client_secret, realtime_connection
from voxserve.config import RealtimeConfig
from voxserve.errors import ErrorCode, VoxError
from voxserve.server.realtime_api.secrets import (
    TOMBSTONE_S,
    ClientSecrets,
    realtime_principal,
    secrets_of,
)
from voxserve.server.session.auth import KeyRing, digest, key_id

KEY = "client-secrets-test-key"
MODEL = "gpt-realtime"
SESSION: dict[str, Any] = {
    "type": "realtime",
    "instructions": "Answer in one short sentence.",
    "audio": {"output": {"voice": "fake", "speed": 1.25}},
}


def start(tmp: Path, **realtime: int) -> LiveServer:
    return start_fake_server_in(tmp, api_keys=[SecretStr(KEY)], realtime=RealtimeConfig(**realtime))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start(tmp_path_factory.mktemp("secrets"))
    yield live
    stop_server(live)


async def first_event(live: LiveServer, key: str) -> dict[str, Any]:
    """What a Realtime connection with `key` is told first."""
    async with realtime_connection(live, key, model=MODEL) as conn:
        event = await conn.recv()
        return event.model_dump(exclude_none=False)


# --- the store ----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_single_use_across_two_stores_on_one_file(tmp_path: Path) -> None:
    path = tmp_path / "secrets.sqlite3"
    one, two = ClientSecrets(path, 10), ClientSecrets(path, 10)
    minted = one.mint("k1", {"instructions": "hi"}, 60)
    redeemed = two.redeem(minted.value)
    assert (redeemed.principal, redeemed.session) == ("k1", {"instructions": "hi"})
    assert redeemed.expires_at == minted.expires_at
    with pytest.raises(VoxError, match="already used") as used:
        one.redeem(minted.value)
    assert used.value.code is ErrorCode.UNAUTHORIZED
    with pytest.raises(VoxError, match="not known"):
        two.redeem("ek_never-minted")
    # Held hashed: the value is nowhere in the file, its digest is.
    one.close()
    two.close()
    rows = sqlite3.connect(path).execute("SELECT digest FROM client_secrets").fetchall()
    assert rows == [(digest(minted.value),)]
    assert minted.value.encode() not in path.read_bytes()


def _redeem_in_child(store: ClientSecrets, value: str, out: Any) -> None:
    out.put(store.redeem(value).principal)


def test_a_secret_minted_before_a_fork_is_redeemed_in_the_child(tmp_path: Path) -> None:
    """As `serve --workers N`: the store object crosses a fork, its connection does not."""
    store = ClientSecrets(tmp_path / "secrets.sqlite3", 10)
    minted = store.mint("k1", None, 60)  # the parent's connection is open
    fork = multiprocessing.get_context("fork")
    out = fork.Queue()
    child = fork.Process(target=_redeem_in_child, args=(store, minted.value, out))
    child.start()
    child.join(timeout=10)
    assert child.exitcode == 0
    assert out.get(timeout=1) == "k1"
    with pytest.raises(VoxError, match="already used"):
        store.redeem(minted.value)


def test_expiry_follows_the_store_clock(tmp_path: Path) -> None:
    clock = Clock()
    store = ClientSecrets(tmp_path / "secrets.sqlite3", 10, clock=clock)
    minted = store.mint(None, None, 10)
    assert minted.expires_at == int(clock.now) + 10
    clock.now += 9.9
    fresh = store.mint(None, None, 10)
    clock.now += 0.2
    with pytest.raises(VoxError, match="expired") as expired:
        store.redeem(minted.value)
    assert expired.value.code is ErrorCode.UNAUTHORIZED
    assert store.redeem(fresh.value).principal is None
    # Long after: purged by the next mint (the bound), then simply unknown.
    clock.now += TOMBSTONE_S + 20
    store.mint(None, None, 10)
    assert len(store) == 1
    with pytest.raises(VoxError, match="not known"):
        store.redeem(minted.value)


def test_the_bound_counts_live_secrets(tmp_path: Path) -> None:
    clock = Clock()
    store = ClientSecrets(tmp_path / "secrets.sqlite3", 2, clock=clock)
    first = store.mint("k", None, 10)
    store.mint("k", None, 60)
    with pytest.raises(VoxError) as full:
        store.mint("k", None, 60)
    assert full.value.code is ErrorCode.QUOTA_EXCEEDED
    assert full.value.retry_after_s == 11  # when the first one expires
    store.redeem(first.value)  # a used secret frees its place
    store.mint("k", None, 60)
    clock.now += 61  # and an expired one does
    store.mint("k", None, 60)
    store.mint("k", None, 60)
    assert len(store) <= 2 * 2  # tombstones included, the rows stay bounded


def test_realtime_principal(tmp_path: Path) -> None:
    keys = KeyRing.from_entries([KEY, "other"])
    store = ClientSecrets(tmp_path / "secrets.sqlite3", 10)
    mine = key_id(digest(KEY))
    assert realtime_principal(keys, store, KEY) == (mine, None)
    minted = store.mint(mine, {"instructions": "x"}, 60)
    assert realtime_principal(keys, store, minted.value) == (mine, {"instructions": "x"})
    with pytest.raises(VoxError, match="wrong API key"):
        realtime_principal(keys, store, "nope")
    # A secret whose key was since removed from the configuration is refused.
    stale = store.mint(key_id(digest("removed")), None, 60)
    with pytest.raises(VoxError, match="no longer accepted"):
        realtime_principal(keys, store, stale.value)
    # Auth off: anyone is anonymous, and a secret still carries its session.
    off = KeyRing([])
    assert realtime_principal(off, store, None) == ("anonymous", None)
    anonymous = store.mint("anonymous", {"instructions": "y"}, 60)
    assert realtime_principal(off, store, anonymous.value) == ("anonymous", {"instructions": "y"})


# --- end to end, with the SDK ---------------------------------------------------------------


async def test_sdk_mints_and_the_secret_opens_one_session(server: LiveServer) -> None:
    before = time.time()
    minted = await mint_client_secret(
        server, KEY, expires_after={"anchor": "created_at", "seconds": 120}, session=SESSION
    )
    assert minted.value.startswith("ek_") and len(minted.value) > 40
    assert before + 119 <= minted.expires_at <= time.time() + 121
    assert minted.session.type == "realtime"
    assert minted.session.instructions == SESSION["instructions"]  # type: ignore[union-attr]
    assert minted.session.audio.output.voice == "fake"  # type: ignore[union-attr]
    # The browser's connection: the ek_ as the SDK's key (Authorization: Bearer ek_...).
    created = await first_event(server, minted.value)
    assert created["type"] == "session.created", created
    session = created["session"]
    assert session["instructions"] == SESSION["instructions"]
    assert session["audio"]["output"]["voice"] == "fake"
    assert session["audio"]["output"]["speed"] == 1.25
    assert session["model"] == MODEL
    # Single use: the same secret a second time is refused.
    again = await first_event(server, minted.value)
    assert again["type"] == "error", again
    assert again["error"]["code"] == "unauthorized"
    assert "already used" in again["error"]["message"]


async def test_a_transcription_secret_opens_a_transcription_session(server: LiveServer) -> None:
    minted = await mint_client_secret(
        server, KEY, session={"type": "transcription", "audio": {"input": {"turn_detection": None}}}
    )
    assert minted.session.type == "transcription"
    created = await first_event(server, minted.value)
    assert created["session"]["type"] == "transcription", created
    assert created["session"]["audio"]["input"]["turn_detection"] is None


async def test_a_browser_offers_the_secret_as_a_subprotocol(server: LiveServer) -> None:
    minted = await mint_client_secret(
        server, KEY, session={"type": "realtime", "instructions": "From a page."}
    )
    url = f"ws://127.0.0.1:{server.settings.port}/v1/realtime?model={MODEL}"
    offered = ["realtime", f"openai-insecure-api-key.{minted.value}"]
    async with connect(url, subprotocols=offered) as ws:  # type: ignore[arg-type]
        assert ws.subprotocol == "realtime"
        created = json.loads(await ws.recv())
    assert created["type"] == "session.created", created
    assert created["session"]["instructions"] == "From a page."


async def test_minting_needs_an_api_key(server: LiveServer) -> None:
    minted = await mint_client_secret(server, KEY)  # defaults: 600 s, no session
    assert 590 <= minted.expires_at - time.time() <= 610
    with pytest.raises(openai.AuthenticationError, match="cannot mint another"):
        await mint_client_secret(server, minted.value)
    with pytest.raises(openai.AuthenticationError, match="wrong API key"):
        await mint_client_secret(server, "not-the-key")
    unknown = await first_event(server, "ek_" + "x" * 43)
    assert unknown["error"]["code"] == "unauthorized" and "not known" in unknown["error"]["message"]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"expires_after": {"anchor": "created_at", "seconds": 5}}, "expires_after.seconds"),
        ({"expires_after": {"seconds": 7201}}, "expires_after.seconds"),
        ({"expires_after": {"seconds": "60"}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "now", "seconds": 60}}, "expires_after.anchor"),
        ({"expires_after": 60}, "expires_after"),
        ({"session": {"type": "realtime", "voices": "x"}}, "voices"),
        ({"session": {"type": "chat"}}, "session.type"),
        ({"session": {"audio": {"output": {"speed": 9}}}}, "session.audio.output.speed"),
        ({"ttl": 60}, "ttl"),
        ({"session": {"audio": {"output": {"voice": "nobody"}}}}, "nobody"),
    ],
)
def test_bad_requests_name_the_field(server: LiveServer, body: dict[str, Any], named: str) -> None:
    answer = httpx.post(
        f"{server.http_url}/v1/realtime/client_secrets",
        json=body,
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert named in error["message"], error
    assert error["code"] in ("invalid_parameter", "invalid_message", "unknown_voice")


async def test_a_full_store_refuses_to_mint(tmp_path: Path) -> None:
    live = start(tmp_path, max_client_secrets=2)
    try:
        async with async_sdk(live, KEY) as client:
            await client.realtime.client_secrets.create()
            await client.realtime.client_secrets.create()
            with pytest.raises(openai.RateLimitError, match="max_client_secrets") as refused:
                await client.realtime.client_secrets.create()
        assert refused.value.response.headers["retry-after"]
        assert len(secrets_of(live.runtime)) == 2
    finally:
        stop_server(live)

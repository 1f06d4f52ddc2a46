"""Hostile input at the client-secret door (POST /v1/realtime/client_secrets, `ek_` tokens on
/v1/realtime): one key's minting flood against another key, session objects of every
hostile class, tokens that are forged, cut, used, expired, a store whose directory is gone or
blocked, and `serve --workers 2` sharing one store. Real servers (in-process with fake
engines; a `voxserve serve` subprocess where the workers matter), the official `openai` SDK
where it has the call, httpx and websockets for the raw cases; a live stream watched beside
the flood."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from pydantic import SecretStr
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.conftest import LiveServer, free_port, start_fake_server_in, stop_server
from tests.helpers import (
    async_sdk,
    mint_client_secret,
    realtime_connection,
    stop_process,
    wait_ready,
)
from tests.hostile.flood import flood
from tests.hostile.watch import watched
from voxserve.config import RealtimeConfig
from voxserve.server.realtime_api.secrets import FILE_NAME, ClientSecrets

ROOT = Path(__file__).resolve().parents[2]
FLOODER, VICTIM, OTHER = "hostile-key-flooder", "hostile-key-victim", "hostile-key-other"
PER_KEY = 4
SESSION_CAP = 4096
MODEL = "gpt-realtime"


def start(tmp: Path, secrets_dir: Path | None = None) -> LiveServer:
    return start_fake_server_in(
        tmp,
        api_keys=[SecretStr(FLOODER), SecretStr(VICTIM), SecretStr(OTHER)],
        realtime=RealtimeConfig(
            max_client_secrets=40,
            max_client_secrets_per_key=PER_KEY,
            max_client_secret_session_bytes=SESSION_CAP,
            secrets_dir=secrets_dir,
        ),
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start(tmp_path_factory.mktemp("hostile-secrets"))
    yield live
    stop_server(live)


def mint_raw(live: LiveServer, key: str, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{live.http_url}/v1/realtime/client_secrets",
        content=body,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json", **headers},
    )


async def refusal(url: str, token: str) -> tuple[dict[str, Any], int | None]:
    """The first event a Realtime connection with `token` gets, and its close code: a
    refused connection must end with a close frame, never a dropped socket (1006)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with connect(url, additional_headers=headers) as ws:
        event = json.loads(await ws.recv())
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
    frame = closed.value.rcvd
    return event, None if frame is None else frame.code


def realtime_url(live: LiveServer) -> str:
    return f"ws://127.0.0.1:{live.settings.port}/v1/realtime?model={MODEL}"


async def test_one_keys_minting_flood_leaves_the_other_keys_served(server: LiveServer) -> None:
    """Finding 7: the unused-secret bound was server-wide, so one key took every key's. The
    flood comes from a child process (tests/hostile/flood.py): the lag watched is the
    server's, not this loop's own httpx work."""
    async with watched(server.http_url, key=VICTIM) as watch:
        answers = await flood(
            server.http_url,
            "/v1/realtime/client_secrets",
            count=60,
            body={"expires_after": {"anchor": "created_at", "seconds": 30}},
            headers={"authorization": f"Bearer {FLOODER}"},
        )
        codes = sorted(a.status_code for a in answers)
        assert codes.count(200) == PER_KEY and codes.count(429) == 60 - PER_KEY, codes
        refused = next(a for a in answers if a.status_code == 429)
        assert refused.json()["error"]["code"] == "quota_exceeded"
        assert "max_client_secrets_per_key" in refused.json()["error"]["message"]
        assert 1 <= int(refused.headers["retry-after"]) <= 31
        # The victim still mints its own bound's worth, and the secret opens its session.
        async with async_sdk(server, VICTIM) as victim:
            minted = [await victim.realtime.client_secrets.create() for _ in range(PER_KEY)]
            async with realtime_connection(server, minted[0].value, model=MODEL) as conn:
                assert (await conn.recv()).type == "session.created"
            # A used secret no longer counts: the victim may mint one more.
            await victim.realtime.client_secrets.create()
    watch.assert_unhurt(max_growth_mb=60)


HUGE = "x" * (SESSION_CAP + 1)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        # over the stored-session cap, in each field that can carry text
        (json.dumps({"session": {"instructions": HUGE}}).encode(), 400, "session_too_large"),
        (
            json.dumps(
                {"session": {"tools": [{"type": "function", "name": "f", "description": HUGE}]}}
            ).encode(),
            400,
            "session_too_large",
        ),
        # 2,100 characters, 4,200 bytes: the cap counts bytes
        (
            json.dumps({"session": {"instructions": "é" * 2100}}, ensure_ascii=False).encode(),
            400,
            "session_too_large",
        ),
        # past the body limit: never read whole
        (
            json.dumps({"session": {"instructions": "y" * 300_000}}).encode(),
            413,
            "message_too_large",
        ),
        # nesting past limits.max_json_depth, in the session and in an ignored field
        (b'{"session": ' + b'{"a": ' * 40 + b"1" + b"}" * 41, 400, "invalid_json"),
        (b'{"session": {"tracing": ' + b"[" * 40 + b"]" * 40 + b"}}", 400, "invalid_json"),
        # encodings: not UTF-8, a lone surrogate, a NUL-laden key, not an object
        (b'{"session": {"instructions": "\xff\xfe"}}', 400, "invalid_json"),
        (b'{"session": {"instructions": "\\ud800"}}', 400, "invalid_message"),
        (b'{"session": {"\\u0000": 1}}', 400, "invalid_parameter"),
        (b'{"session": "realtime"}', 400, "invalid_message"),
        (b"[]", 400, "invalid_json"),
    ],
    ids=[
        "instructions",
        "tool",
        "multibyte",
        "body",
        "deep",
        "deep-ignored",
        "latin1",
        "surrogate",
        "nul-key",
        "string",
        "array",
    ],
)
def test_hostile_session_objects_are_refused_before_anything_is_stored(
    server: LiveServer, body: bytes, status: int, code: str
) -> None:
    """Finding 9: a secret stored the whole session object (248 KB each); now each class of
    hostile session is a 4xx with its code, and nothing is stored."""
    path = server.settings.cache.path().parent / FILE_NAME
    before = _rows(path)
    answer = mint_raw(server, OTHER, body)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["code"] == code, answer.json()
    assert _rows(path) == before


def test_a_session_is_stored_compactly_under_its_cap(server: LiveServer) -> None:
    """Fields that take no effect (OpenAI's accepted-and-unused ones) are not stored: a
    session with a large `prompt` or `tracing` costs the store only what applies."""
    unused = {"prompt": {"id": "p", "variables": {"v": "z" * 20_000}}, "tracing": "auto"}
    session = {"type": "realtime", "instructions": "Be brief. ☺", **unused}
    answer = mint_raw(server, OTHER, json.dumps({"session": session}).encode())
    assert answer.status_code == 200, answer.text
    db = sqlite3.connect(server.settings.cache.path().parent / FILE_NAME)
    longest = db.execute("SELECT MAX(LENGTH(CAST(session AS BLOB))) FROM client_secrets").fetchone()
    db.close()
    assert longest[0] <= SESSION_CAP
    stored = sqlite3.connect(server.settings.cache.path().parent / FILE_NAME).execute(
        "SELECT session FROM client_secrets WHERE session LIKE '%Be brief%'"
    )
    assert json.loads(stored.fetchone()[0]) == {"type": "realtime", "instructions": "Be brief. ☺"}


def _rows(path: Path) -> int:
    """Secrets stored; 0 before the store's first mint made its file and table. Read-only:
    a plain connect would make an empty database the server then finds without its table
    (which failed these tests whenever they ran before any mint)."""
    if not path.exists():
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'client_secrets'").fetchone():
            return 0
        return int(db.execute("SELECT COUNT(*) FROM client_secrets").fetchone()[0])
    finally:
        db.close()


async def test_forged_cut_used_and_expired_tokens_get_an_error_and_a_close_frame(
    server: LiveServer,
) -> None:
    minted = await mint_client_secret(server, OTHER)
    used = await mint_client_secret(server, OTHER)
    async with realtime_connection(server, used.value, model=MODEL) as conn:
        assert (await conn.recv()).type == "session.created"
    # Expired: minted into the same file by a store whose clock is 100 s behind.
    path = server.settings.cache.path().parent / FILE_NAME
    past = ClientSecrets(path, 40, clock=lambda: time.time() - 100)
    expired = past.mint(OTHER, None, 10)
    past.close()
    cases = {
        "forged": ("ek_" + "A" * 43, "not known"),
        "cut": (minted.value[:-1], "not known"),
        "bare": ("ek_", "not known"),
        "long": ("ek_" + "B" * 4000, "not known"),
        "used": (used.value, "already used"),
        "expired": (expired.value, "has expired"),
    }
    for name, (token, said) in cases.items():
        event, close = await refusal(realtime_url(server), token)
        assert event["type"] == "error", (name, event)
        assert event["error"]["code"] == "unauthorized", (name, event)
        assert said in event["error"]["message"], (name, event)
        assert close == 1008, (name, close)
    # None of that used the good one up.
    async with realtime_connection(server, minted.value, model=MODEL) as conn:
        assert (await conn.recv()).type == "session.created"


async def test_a_store_whose_directory_is_blocked_is_503_and_a_close_frame(
    tmp_path: Path,
) -> None:
    """Finding 13: minting was a 500 and an `ek_` on /v1/realtime dropped the connection
    (an ASGI exception, no close frame)."""
    store_dir = tmp_path / "secrets"
    live = start(tmp_path / "cache", secrets_dir=store_dir)
    try:
        good = await mint_client_secret(live, OTHER)
        # The directory goes and a file takes its place: nothing can create or open it.
        shutil.rmtree(store_dir)
        store_dir.write_text("in the way")
        answer = mint_raw(live, OTHER, b"{}")
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "storage_unavailable"
        assert "secrets_dir" in answer.json()["error"]["message"]
        assert answer.headers["retry-after"]
        with pytest.raises(openai.InternalServerError, match="store cannot be used") as sdk_error:
            await mint_client_secret(live, OTHER)
        assert sdk_error.value.code == "storage_unavailable"
        event, close = await refusal(realtime_url(live), good.value)
        assert event["error"]["code"] == "storage_unavailable", event
        assert close is not None and close != 1006
        # A missing directory is made again (0700) at the next use: minting works again.
        store_dir.unlink()
        again = await mint_client_secret(live, OTHER)
        assert (store_dir / FILE_NAME).is_file() and store_dir.stat().st_mode & 0o777 == 0o700
        async with realtime_connection(live, again.value, model=MODEL) as conn:
            assert (await conn.recv()).type == "session.created"
    finally:
        stop_server(live)


def test_workers_share_one_store(tmp_path: Path) -> None:
    """Finding 5: each worker kept its store beside its own `worker-N` cache: 8 of 20
    fresh secrets were "not known" on the worker the connection reached."""
    port = free_port()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "VOXSERVE_API_KEYS": OTHER}
    cmd = [sys.executable, "-m", "voxserve", "serve", "--config", "bench/load-engines.toml"]
    cmd += ["--port", str(port), "--workers", "2", "--log-format", "text"]
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(proc, port, log, workers=2)
        base = f"http://127.0.0.1:{port}"
        minted: list[str] = []
        for _ in range(24):
            with httpx.Client() as fresh:  # a new connection: either worker may answer
                answer = fresh.post(
                    f"{base}/v1/realtime/client_secrets",
                    json={},
                    headers={"authorization": f"Bearer {OTHER}"},
                )
            assert answer.status_code == 200, answer.text
            minted.append(answer.json()["value"])

        async def use_all() -> list[str]:
            seen = []
            for value in minted:
                url = f"ws://127.0.0.1:{port}/v1/realtime?model={MODEL}"
                headers = {"Authorization": f"Bearer {value}"}
                async with connect(url, additional_headers=headers) as ws:
                    seen.append(json.loads(await ws.recv())["type"])
            return seen

        assert asyncio.run(use_all()) == ["session.created"] * len(minted), log.read_text()
        shared = tmp_path / "xdg" / "voxserve" / FILE_NAME
        assert shared.is_file() and not list((tmp_path / "xdg").glob(f"**/worker-*/{FILE_NAME}"))
    finally:
        stop_process(proc)

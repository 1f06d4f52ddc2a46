"""API keys over real sockets, per transport: HTTP bearer, WebSocket header or subprotocol
(what the browser page sends), gRPC metadata; the Origin check and CORS; the handshake
timeout setting. Fake engines: this is about the doors, not the models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import SecretStr
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import fake_runtime
from tests.helpers import settings_with
from tests.transports.grpc_client import error_code, stub
from voxserve.config import load_settings
from voxserve.v1 import voxserve_pb2 as pb

KEY = "test-key-0123"
OTHER_ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[LiveServer]:
    settings = settings_with(
        load_settings(port=free_port(), log_level="warning"),
        api_keys=[SecretStr(KEY)],
        cors_allowed_origins=[OTHER_ORIGIN],
        limits={"handshake_timeout_s": 0.5},
    )
    live = start_server(settings, fake_runtime(settings), grpc_port=free_port())
    yield live
    stop_server(live)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    ("headers", "status"), [({}, 401), (bearer("wrong"), 401), (bearer(KEY), 200)]
)
def test_http_needs_a_valid_bearer_key(
    keyed_server: LiveServer, headers: dict[str, str], status: int
) -> None:
    for path in ("/v1/voices", "/v1/models"):
        response = httpx.get(keyed_server.http_url + path, headers=headers)
        assert response.status_code == status
        if status == 401:
            assert response.json()["error"]["code"] == "unauthorized"
            assert response.headers["www-authenticate"] == "Bearer"
    speech = httpx.post(
        keyed_server.http_url + "/v1/audio/speech", json={"input": "hi"}, headers=headers
    )
    assert speech.status_code == status


def test_open_routes_stay_open(keyed_server: LiveServer) -> None:
    for path in ("/healthz", "/readyz", "/", "/web/app.js", "/metrics"):
        assert httpx.get(keyed_server.http_url + path).status_code == 200, path


async def _first_event_and_close(ws_url: str, **kwargs: Any) -> tuple[dict[str, Any], int]:
    async with connect(ws_url, **kwargs) as ws:
        event = json.loads(await ws.recv())
        try:
            await ws.recv()
        except ConnectionClosed:
            pass
        assert ws.close_code is not None
        return event, ws.close_code


@pytest.mark.parametrize("key", [None, "wrong"])
async def test_ws_refuses_without_a_valid_key(keyed_server: LiveServer, key: str | None) -> None:
    headers = bearer(key) if key else None
    event, code = await _first_event_and_close(keyed_server.ws_url, additional_headers=headers)
    assert event["type"] == "error"
    assert event["code"] == "unauthorized"
    assert event["fatal"] is True
    assert code == 1008


async def _start_tts(ws_url: str, **kwargs: Any) -> dict[str, Any]:
    async with connect(ws_url, **kwargs) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "tts"}))
        started: dict[str, Any] = json.loads(await ws.recv())
        assert ws.subprotocol == kwargs.get("expect_subprotocol")
        return started


async def test_ws_accepts_the_header(keyed_server: LiveServer) -> None:
    async with connect(keyed_server.ws_url, additional_headers=bearer(KEY)) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "tts"}))
        assert json.loads(await ws.recv())["type"] == "session.started"


async def test_ws_accepts_the_page_subprotocol_and_never_echoes_the_key(
    keyed_server: LiveServer,
) -> None:
    protocols: Any = ["voxserve.v1", f"voxserve.bearer.{KEY}"]
    async with connect(keyed_server.ws_url, subprotocols=protocols) as ws:
        assert ws.subprotocol == "voxserve.v1"
        await ws.send(json.dumps({"type": "session.start", "mode": "tts"}))
        assert json.loads(await ws.recv())["type"] == "session.started"
    wrong: Any = ["voxserve.v1", "voxserve.bearer.nope"]
    event, code = await _first_event_and_close(keyed_server.ws_url, subprotocols=wrong)
    assert (event["code"], code) == ("unauthorized", 1008)


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [(OTHER_ORIGIN, True), ("https://evil.example", False), (None, True)],
)
async def test_ws_origin_check(keyed_server: LiveServer, origin: str | None, allowed: bool) -> None:
    async with connect(keyed_server.ws_url, additional_headers=bearer(KEY), origin=origin) as ws:  # type: ignore[arg-type]
        if allowed:
            await ws.send(json.dumps({"type": "session.start", "mode": "tts"}))
        event = json.loads(await ws.recv())
    if allowed:
        assert event["type"] == "session.started"
    else:
        assert event["code"] == "origin_not_allowed"


async def test_ws_same_origin_page_is_allowed(keyed_server: LiveServer) -> None:
    own = f"http://127.0.0.1:{keyed_server.settings.port}"
    async with connect(keyed_server.ws_url, additional_headers=bearer(KEY), origin=own) as ws:  # type: ignore[arg-type]
        await ws.send(json.dumps({"type": "session.start", "mode": "tts"}))
        assert json.loads(await ws.recv())["type"] == "session.started"


async def test_ws_handshake_timeout_is_a_setting(keyed_server: LiveServer) -> None:
    event, code = await _first_event_and_close(keyed_server.ws_url, additional_headers=bearer(KEY))
    assert event["code"] == "not_started"
    assert "0.5 s" in event["message"]
    assert code == 1008


def test_cors_allows_only_listed_origins(keyed_server: LiveServer) -> None:
    url = keyed_server.http_url + "/v1/voices"
    preflight = {
        "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "authorization",
    }
    ok = httpx.options(url, headers={"Origin": OTHER_ORIGIN, **preflight})
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == OTHER_ORIGIN
    bad = httpx.options(url, headers={"Origin": "https://evil.example", **preflight})
    assert "access-control-allow-origin" not in bad.headers
    got = httpx.get(url, headers={"Origin": OTHER_ORIGIN, **bearer(KEY)})
    assert got.headers["access-control-allow-origin"] == OTHER_ORIGIN


def test_cors_closed_by_default(live_server: LiveServer) -> None:
    response = httpx.get(live_server.http_url + "/healthz", headers={"Origin": OTHER_ORIGIN})
    assert "access-control-allow-origin" not in response.headers


@pytest.mark.parametrize("key", [None, "wrong"])
async def test_grpc_refuses_without_a_valid_key(keyed_server: LiveServer, key: str | None) -> None:
    metadata = (("authorization", f"Bearer {key}"),) if key else None
    async with grpc.aio.insecure_channel(keyed_server.grpc_target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub(channel).ListVoices(pb.ListVoicesRequest(), metadata=metadata, timeout=5)
        assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert error_code(caught.value) == "unauthorized"
        # Streaming RPCs are refused the same way, before any config is read.
        call = stub(channel).Recognize(metadata=metadata, timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as streamed:
            await call.read()
        assert streamed.value.code() is grpc.StatusCode.UNAUTHENTICATED


async def test_grpc_accepts_the_key_and_health_stays_open(keyed_server: LiveServer) -> None:
    async with grpc.aio.insecure_channel(keyed_server.grpc_target) as channel:
        voices = await stub(channel).ListVoices(
            pb.ListVoicesRequest(), metadata=(("authorization", f"Bearer {KEY}"),), timeout=5
        )
        assert voices.default_voice == "fake"
        health = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

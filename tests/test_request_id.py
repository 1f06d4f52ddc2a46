"""Every HTTP answer names its request with `x-request-id` (server/session/request_id.py): what the
official `openai` SDK reads as a response's `request_id` and an error's, on every route,
on errors, on the guards' refusals and Starlette's own 404, and on a WebSocket handshake;
the same id as `X-Voxserve-Trace-Id`, the one the logs carry. Real server (fake engines),
real SDK."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from websockets.asyncio.client import connect

from tests.conftest import LiveServer


@pytest.fixture(scope="module")
def sdk(fake_server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=fake_server.http_url + "/v1", api_key="x", max_retries=0, timeout=30.0
    ) as client:
        yield client


def request_id(headers: httpx.Headers) -> str:
    """The answer's id, checked: 16 hex digits, the trace id header the same."""
    value = headers["x-request-id"]
    assert len(value) == 16 and int(value, 16) >= 0, value
    assert headers["x-voxserve-trace-id"] == value
    return value


def test_the_sdk_reads_the_request_id_of_answers_and_errors(sdk: openai.OpenAI) -> None:
    raw = sdk.audio.speech.with_raw_response.create(
        model="tts-1", voice="alloy", input="Hello there.", response_format="wav"
    )
    first = request_id(raw.headers)
    assert raw.request_id == first
    voices = sdk.models.with_raw_response.list()
    assert voices.request_id == request_id(voices.headers) != first  # one id per request
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.audio.speech.create(model="tts-1", voice="no-such-voice", input="Hi.")
    assert refused.value.request_id == request_id(refused.value.response.headers)
    assert refused.value.code == "unknown_voice"


def test_refusals_before_any_route_carry_it_too(fake_server: LiveServer) -> None:
    with httpx.Client(base_url=fake_server.http_url, timeout=10) as http:
        answers = {
            "404 of no route": http.get("/v1/no-such-route"),
            "405 of a route": http.delete("/v1/audio/speech"),
            "Host guard": http.get("/v1/models", headers={"host": "evil.example"}),
            "Origin guard": http.post(
                "/v1/audio/speech",
                json={"input": "Hi.", "voice": "alloy"},
                headers={"origin": "https://evil.example"},
            ),
            "health": http.get("/healthz"),
        }
    expected = {
        "404 of no route": 404,
        "405 of a route": 405,
        "Host guard": 403,
        "Origin guard": 403,
        "health": 200,
    }
    assert {name: a.status_code for name, a in answers.items()} == expected
    ids = [request_id(a.headers) for a in answers.values()]
    assert len(set(ids)) == len(ids)


async def test_a_websocket_handshake_carries_it(fake_server: LiveServer) -> None:
    url = fake_server.ws_url.replace("/v1/stream", "/v1/realtime?model=gpt-realtime")
    async with connect(url) as ws:
        assert ws.response is not None
        request_id(httpx.Headers(list(ws.response.headers.raw_items())))

"""Requests a browser page of another site can make without asking (no CORS preflight:
`text/plain` or form bodies, the page's `Origin` attached): refused on every /v1 route
with or without API keys, before any work is done (nothing synthesised, nothing cached);
the server's own page (same origin), listed origins and clients that send no `Origin`
(the openai SDK) are served as before. JSON routes take only `application/json`."""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
from pydantic import SecretStr

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeTts, fake_runtime, tone
from voxserve.audio.wav import write_wav
from voxserve.config import load_settings

KEY = "cross-site-key-1"
ADMIN_KEY = "cross-site-admin-1"
LISTED = "https://app.example"
FOREIGN = ["https://evil.example", "http://127.0.0.1:1", "null", "https://app.example.evil"]


def _server(keyed: bool) -> LiveServer:
    settings = load_settings(port=free_port(), log_level="warning")
    update: dict[str, object] = {
        "cors_allowed_origins": [LISTED],
        "admin_key": SecretStr(ADMIN_KEY),
    }
    if keyed:
        update["api_keys"] = [SecretStr(KEY)]
    settings = settings.model_copy(update=update)
    return start_server(settings, fake_runtime(settings, tts=FakeTts()))


@pytest.fixture(scope="module", params=["no keys", "keys"])
def server(request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    live = _server(request.param == "keys")
    yield live
    stop_server(live)


def _auth(live: LiveServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"} if live.settings.api_keys else {}


def _wav() -> bytes:
    return write_wav(tone(440, 0.5).astype(np.int16), 16_000)


def _request(live: LiveServer, route: str, origin: str | None, text: str) -> httpx.Response:
    """What a page can send cross-site without a preflight, or (origin None) a plain client."""
    headers = _auth(live)
    if origin is not None:
        headers["Origin"] = origin
    url = live.http_url + route
    if route == "/v1/audio/speech":
        body = json.dumps({"input": text, "voice": "fake"})
        # A browser page would send text/plain; the guard must not depend on it.
        headers["Content-Type"] = "application/json"
        return httpx.post(url, content=body, headers=headers, timeout=10)
    if route == "/v1/audio/transcriptions":
        files = {"file": ("a.wav", io.BytesIO(_wav()), "audio/wav")}
        return httpx.post(url, files=files, data={"model": "whisper-1"}, headers=headers)
    return httpx.get(url, headers=headers)


ROUTES = ["/v1/audio/speech", "/v1/audio/transcriptions", "/v1/voices", "/v1/models"]
_words = (f"word{n}" for n in itertools.count())


@pytest.mark.parametrize(("route", "origin"), list(itertools.product(ROUTES, FOREIGN)))
def test_a_foreign_origin_is_refused_before_any_work(
    server: LiveServer, route: str, origin: str
) -> None:
    tts = server.runtime.engines.tts[0]
    assert isinstance(tts, FakeTts)
    text = next(_words)
    response = _request(server, route, origin, text)
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in response.headers
    assert not [call for call in tts.calls if text in call]


@pytest.mark.parametrize(
    ("route", "origin"), list(itertools.product(ROUTES, ["own", LISTED, None]))
)
def test_own_page_listed_origins_and_plain_clients_are_served(
    server: LiveServer, route: str, origin: str | None
) -> None:
    if origin == "own":
        origin = server.http_url  # the page this server serves
    response = _request(server, route, origin, next(_words))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "text/plain; charset=utf-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "text/json",
        "application/jsonx",
    ],
)
def test_json_routes_take_only_application_json(
    server: LiveServer, content_type: str | None
) -> None:
    headers = _auth(server)
    if content_type is not None:
        headers["Content-Type"] = content_type
    body = b'{"input": "hello", "voice": "fake", "sentences": ["hello"]}'
    speech = httpx.post(server.http_url + "/v1/audio/speech", content=body, headers=headers)
    admin = {**headers, "Authorization": f"Bearer {ADMIN_KEY}"}
    url = server.http_url + "/admin/cache/invalidate"
    invalidate = httpx.post(url, content=body, headers=admin)
    for response in (speech, invalidate):
        assert response.status_code == 415, response.text
        assert response.json()["error"]["code"] == "unsupported_media_type"


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"]
)
def test_application_json_with_parameters_is_taken(server: LiveServer, content_type: str) -> None:
    headers = {**_auth(server), "Content-Type": content_type}
    body = b'{"input": "hello", "voice": "fake"}'
    response = httpx.post(server.http_url + "/v1/audio/speech", content=body, headers=headers)
    assert response.status_code == 200, response.text


def test_the_openai_sdk_is_unaffected(server: LiveServer) -> None:
    """It sends application/json and multipart forms, and no Origin."""
    client = openai.OpenAI(base_url=server.http_url + "/v1", api_key=KEY, max_retries=0)
    with client:
        speech = client.audio.speech.create(
            model="tts-1", voice="fake", input="hello there", response_format="wav"
        )
        assert speech.content.startswith(b"RIFF")
        text = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", _wav()))
        assert isinstance(text.text, str)

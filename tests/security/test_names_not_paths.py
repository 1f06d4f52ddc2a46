"""Names are not paths: voice, model and language ids, and the page's asset names, are looked
up among what is registered, never joined to a file path. Path-like ids are refused with the
registered-name errors, and (checked with an audit hook on `open`) no file is opened for them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, stop_server
from tests.transports.conftest import start_fake_server
from voxserve.audio.wav import write_wav

HOSTILE = [
    "../../etc/passwd",
    "..%2f..%2fetc%2fpasswd",
    "%2e%2e/%2e%2e/etc/passwd",
    "/etc/passwd",
    "C:\\Windows\\win.ini",
    "joe\x00.onnx",
    "~/.ssh/id_rsa",
    "file:///etc/passwd",
]

_opened: list[str] = []
_watching = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _watching and event == "open" and isinstance(args[0], str | bytes):
        _opened.append(str(args[0]))


sys.addaudithook(_audit)  # process-wide and permanent: cheap while _watching is False


@pytest.fixture
def no_file_opened() -> Iterator[None]:
    """Fail if anything opens a path containing one of the hostile names' targets."""
    global _watching
    _opened.clear()
    _watching = True
    try:
        yield
    finally:
        _watching = False
    bad = [p for p in _opened if any(t in p for t in ("passwd", "win.ini", "id_rsa"))]
    assert not bad, bad


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = start_fake_server()
    yield live
    stop_server(live)


def wav_bytes() -> bytes:
    return write_wav(np.zeros(1600, dtype="<i2"), 16_000)


@pytest.mark.usefixtures("no_file_opened")
@pytest.mark.parametrize("name", HOSTILE)
def test_http_speech_voice_and_model(server: LiveServer, name: str) -> None:
    url = server.http_url + "/v1/audio/speech"
    voice = httpx.post(url, json={"input": "hi", "voice": name})
    assert voice.status_code == 400
    assert voice.json()["error"]["code"] == "unknown_voice"
    model = httpx.post(url, json={"input": "hi", "model": name})
    assert model.status_code == 400
    assert model.json()["error"]["code"] == "unknown_model"  # a name, never looked up as a path


@pytest.mark.usefixtures("no_file_opened")
@pytest.mark.parametrize("name", HOSTILE)
def test_http_transcription_language_and_model(server: LiveServer, name: str) -> None:
    url = server.http_url + "/v1/audio/transcriptions"
    files = {"file": ("a.wav", wav_bytes(), "audio/wav")}
    language = httpx.post(url, files=files, data={"model": "whisper-1", "language": name})
    assert language.status_code == 400
    assert language.json()["error"]["code"] == "unknown_language"
    model = httpx.post(url, files=files, data={"model": name})
    assert model.status_code == 400
    assert model.json()["error"]["code"] == "unknown_model"  # a name, never looked up as a path


@pytest.mark.usefixtures("no_file_opened")
@pytest.mark.parametrize("name", HOSTILE)
async def test_ws_voice_and_language(server: LiveServer, name: str) -> None:
    for field, mode, code in (
        ("voice", "tts", "unknown_voice"),
        ("language", "asr", "unknown_language"),
    ):
        async with connect(server.ws_url) as ws:
            await ws.send(json.dumps({"type": "session.start", "mode": mode, field: name}))
            event = json.loads(await ws.recv())
        assert (event["type"], event["code"], event["fatal"]) == ("error", code, True)


@pytest.mark.usefixtures("no_file_opened")
@pytest.mark.parametrize(
    "path",
    [
        "/web/../../etc/passwd",
        "/web/..%2f..%2fetc%2fpasswd",
        "/web/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/web/%2fetc%2fpasswd",
        "/web/app.js%00.png",
    ],
)
def test_page_assets_are_a_fixed_listing(server: LiveServer, path: str) -> None:
    response = httpx.get(server.http_url + path)
    assert response.status_code == 404
    assert b"root:" not in response.content

"""The openai TTS engine refuses a 200 whose body is not audio (issue 24, item 5).

The remote here is a stand-in for a misbehaving OpenAI-compatible server (a proxy's HTML
page, a JSON body under 200): a few lines of `http.server`, since no real server we can run
does this on purpose. Before, the HTML bytes were played as PCM noise."""

from __future__ import annotations

import http.server
from collections.abc import Iterator

import pytest

from tests.helpers import http_standin
from voxserve.engines.openai_tts import OpenAITts
from voxserve.errors import ErrorCode, VoxError


class NotAudio(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = b"<html><body>502 Bad Gateway</body></html>"
        self.send_response(200)
        self.send_header("content-type", "text/html; charset=utf-8")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def base_url() -> Iterator[str]:
    with http_standin(NotAudio) as url:
        yield url


def test_an_html_page_under_200_is_an_engine_error(base_url: str) -> None:
    engine = OpenAITts(base_url=base_url, voices={"amy": "joe"}, timeout_s=5)
    try:
        with pytest.raises(VoxError) as failed:
            list(engine.synthesize("Hello.", voice="amy"))
    finally:
        engine.close()
    assert failed.value.code is ErrorCode.ENGINE_ERROR
    assert "'text/html; charset=utf-8', not pcm audio" in str(failed.value)

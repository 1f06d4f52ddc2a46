"""The browser page (GET /) in its WebSocket mode, end to end in a real headless Chromium.

Debian's `chromium` hears tests/fixtures/command.wav through its fake microphone; the page
streams it to a real server (the default engines) over /v1/stream and must show the words,
play the reply audio and report latency numbers. Playwright drives the system browser: no
browser is downloaded. The WebRTC mode (the default) has its own test:
tests/web/test_browser_webrtc.py.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tests.web.browser import open_page

# A URL with a scheme where a page loads something: src/href, import, fetch, addModule, url().
EXTERNAL = re.compile(r"""(src=|href=|from\s|fetch\(|addModule\(|url\()\s*["']?(https?:)?//""")


def test_page_and_assets_are_served(live_server: LiveServer) -> None:
    base = live_server.http_url
    page = httpx.get(f"{base}/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/web/app.js">' in page.text
    for name, kind in [
        ("app.js", "text/javascript"),
        ("capture-worklet.js", "text/javascript"),
        ("ui.js", "text/javascript"),
        ("webrtc.js", "text/javascript"),
        ("style.css", "text/css"),
    ]:
        asset = httpx.get(f"{base}/web/{name}")
        assert asset.status_code == 200, name
        assert asset.headers["content-type"].startswith(kind), name
        # Nothing outside the server is fetched: every URL the files load is relative.
        assert not EXTERNAL.search(asset.text), name
    assert not EXTERNAL.search(page.text)
    assert httpx.get(f"{base}/web/../pyproject.toml").status_code == 404
    assert httpx.get(f"{base}/web/missing.js").status_code == 404
    options = httpx.get(f"{base}/web/options.json").json()
    assert "assistant" in options["modes"]
    assert options["default_voice"] in [v["id"] for v in options["voices"]]
    assert "en" in options["languages"]


def test_speak_to_the_page_in_chromium(
    live_server: LiveServer, chromium: None, mic_wav: Path
) -> None:
    started = time.monotonic()
    with open_page(live_server, mic_wav) as (page, errors):
        page.select_option("#transport", "websocket")
        page.select_option("#mode", "assistant")
        page.click("#start")

        # The words in the transcript, and reply audio actually played (sources ended).
        page.wait_for_function(
            """() => {
                const t = document.getElementById("transcript").textContent.toLowerCase();
                const app = document.getElementById("app");
                return t.includes("what time is it") && Number(app.dataset.replyPlayedMs) > 0;
            }""",
            timeout=30_000,
        )
        transcript = page.inner_text("#transcript")
        assert "what time is it" in transcript.lower(), transcript
        assert "assistant:" in transcript.lower(), transcript
        assert int(page.get_attribute("#app", "data-reply-chunks") or 0) > 0

        # Latency panel: numbers for this turn; server panel: read from /metrics.
        for cell in ("#lat-ttfp", "#lat-final", "#lat-turn"):
            assert re.fullmatch(r"\d+ ms \(\d+ ms\)", page.inner_text(cell)), cell
        page.wait_for_function(
            "() => document.querySelectorAll('#srv-stages tbody tr').length > 0",
            timeout=5_000,
        )
        assert page.inner_text("#srv-sessions").isdigit()
        assert page.get_attribute("#app", "data-state") == "connected"
        assert page.get_attribute("#app", "data-transport") == "websocket"
        assert page.is_hidden("#alert")
        assert not errors, errors
    assert time.monotonic() - started < 40


def test_page_says_when_the_server_refuses_and_reconnects(
    live_server: LiveServer, chromium: None, mic_wav: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the session limit the server closes with 1013 `overloaded`: the page says so and
    tries again; once there is room it gets a session without a click."""
    monkeypatch.setattr(live_server.runtime.settings.limits, "max_sessions", 0)
    with open_page(live_server, mic_wav) as (page, _errors):
        page.select_option("#transport", "websocket")
        page.click("#start")
        page.wait_for_selector("#alert:not([hidden])", timeout=10_000)
        alert = page.inner_text("#alert")
        assert "1013" in alert and "overloaded" in alert and "Retrying" in alert, alert
        monkeypatch.undo()
        page.wait_for_selector("main[data-state=connected]", timeout=10_000)
        assert page.is_hidden("#alert")


def test_page_says_when_the_microphone_is_denied(
    live_server: LiveServer, chromium: None, mic_wav: Path
) -> None:
    with open_page(live_server, mic_wav, allow_mic=False) as (page, errors):
        page.click("#start")
        page.wait_for_selector("#alert:not([hidden])", timeout=10_000)
        assert "Microphone access was denied" in page.inner_text("#alert")
        assert page.get_attribute("#app", "data-state") == "idle"
        assert page.is_enabled("#start")
        assert not errors, errors

"""The browser page's WebRTC mode (its default), end to end in a real headless Chromium.

Chromium's fake microphone says "What time is it?" (tests/fixtures/command.wav) on an Opus
track of a real RTCPeerConnection; the page posts its offer to POST /v1/realtime/calls of a
real server (the default engines, aiortc on real UDP sockets) and must show the words from the
`oai-events` data channel, play the reply's track on its <audio> element with sound in it, show
latency figures, and hang up with DELETE. Set VOXSERVE_PAGE_SCREENSHOT=docs/page.png to save
the page after the round trip (the README's picture).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.conftest import LiveServer
from tests.web.browser import open_page

if TYPE_CHECKING:
    from playwright.sync_api import Request, Response

CALL_PATH = "/v1/realtime/calls"


def test_talk_to_the_page_over_webrtc(
    live_server: LiveServer, chromium: None, mic_wav: Path
) -> None:
    started = time.monotonic()
    posts: list[Request] = []
    deletes: list[Response] = []
    with open_page(live_server, mic_wav) as (page, errors):
        page.on("request", lambda r: posts.append(r) if r.method == "POST" else None)
        page.on("response", lambda r: deletes.append(r) if r.request.method == "DELETE" else None)
        assert page.input_value("#transport") == "webrtc"  # the default in a WebRTC browser
        # What a deployed page holds: a client secret its backend minted, not the key.
        minted = httpx.post(f"{live_server.http_url}/v1/realtime/client_secrets", json={})
        secret = minted.json()["value"]
        assert secret.startswith("ek_")
        page.fill("#api-key", secret)
        page.click("#start")

        # The words (from the data channel) and reply audio heard on the reply's track.
        page.wait_for_function(
            """() => {
                const t = document.getElementById("transcript").textContent.toLowerCase();
                const app = document.getElementById("app");
                return t.includes("what time is it") && Number(app.dataset.replyPlayedMs) >= 200;
            }""",
            timeout=30_000,
        )
        assert page.get_attribute("#app", "data-transport") == "webrtc"
        transcript = page.inner_text("#transcript")
        assert "what time is it" in transcript.lower(), transcript
        assert "assistant:" in transcript.lower(), transcript
        assert int(page.get_attribute("#app", "data-reply-chunks") or 0) >= 1  # replies started

        # The <audio> element plays the server's live track, and its clock runs.
        audio = page.evaluate(
            """() => {
                const el = document.getElementById("reply-audio");
                const tracks = el.srcObject ? el.srcObject.getAudioTracks() : [];
                return {live: tracks.length === 1 && tracks[0].readyState === "live",
                        paused: el.paused, time: el.currentTime};
            }"""
        )
        assert audio["live"] and not audio["paused"] and audio["time"] > 0.2, audio

        # One offer, as OpenAI's clients send it: raw SDP, with an Opus audio line and the
        # data channel.
        calls = [r for r in posts if r.url.endswith(CALL_PATH)]
        assert len(calls) == 1, [r.url for r in posts]
        assert calls[0].headers["content-type"] == "application/sdp"
        assert calls[0].headers["authorization"] == f"Bearer {secret}"
        offer = calls[0].post_data or ""
        assert "m=audio" in offer and "opus/48000" in offer and "m=application" in offer

        for cell in ("#lat-ttfp", "#lat-final", "#lat-turn"):
            assert re.fullmatch(r"\d+ ms \(\d+ ms\)", page.inner_text(cell)), cell
        assert page.inner_text("#lat-loss-label") == "Packets lost (concealed)"
        assert "speech_stopped" in page.inner_text("#lat-note")
        assert page.get_attribute("#app", "data-state") == "connected"
        assert page.is_hidden("#alert"), page.inner_text("#alert")

        shot = os.environ.get("VOXSERVE_PAGE_SCREENSHOT")
        if shot:
            page.wait_for_timeout(2_100)  # one more server-panel refresh
            page.screenshot(path=shot)

        # Hang up: the page closes the peer connection and DELETEs the call's Location.
        page.click("#stop")
        page.wait_for_selector("main[data-state=idle]", timeout=5_000)
        deadline = time.monotonic() + 5
        while not deletes and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        assert len(deletes) == 1, deletes
        assert re.search(rf"{CALL_PATH}/[^/]+$", deletes[0].url), deletes[0].url
        assert deletes[0].status in (200, 204), deletes[0].status
        assert page.evaluate("document.getElementById('reply-audio').srcObject") is None
        assert not errors, errors

    # The server freed the call: no session left active.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _active_sessions(live_server):
        time.sleep(0.1)
    assert _active_sessions(live_server) == 0
    assert time.monotonic() - started < 40


def _active_sessions(live_server: LiveServer) -> float:
    text = httpx.get(f"{live_server.http_url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("voxserve_sessions_active{")
    )


def test_page_retries_a_refused_call(
    live_server: LiveServer, chromium: None, mic_wav: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the session limit POST /v1/realtime/calls answers 503 `overloaded`: the page says
    so and calls again after Retry-After; once there is room the call connects."""
    monkeypatch.setattr(live_server.runtime.settings.limits, "max_sessions", 0)
    with open_page(live_server, mic_wav) as (page, errors):
        page.click("#start")
        page.wait_for_selector("#alert:not([hidden])", timeout=10_000)
        alert = page.inner_text("#alert")
        assert "HTTP 503" in alert and "overloaded" in alert and "Retrying" in alert, alert
        assert page.get_attribute("#app", "data-state") == "connecting"
        monkeypatch.undo()
        page.wait_for_selector("main[data-state=connected]", timeout=10_000)
        assert page.get_attribute("#app", "data-transport") == "webrtc"
        assert page.is_hidden("#alert")
        page.click("#stop")
        page.wait_for_selector("main[data-state=idle]", timeout=5_000)
        # The refusal is the only console error (Chromium logs a failed fetch itself).
        assert all("503" in e for e in errors), errors


def test_page_falls_back_to_the_websocket(
    live_server: LiveServer, chromium: None, mic_wav: Path
) -> None:
    """A server installed without the `webrtc` extra answers the offer 501
    `webrtc_unavailable` (tests/webrtc hold the server to that); the page says so and talks
    over /v1/stream instead. The browser answers that one POST itself: this server has aiortc."""
    body = {"error": {"code": "webrtc_unavailable", "message": "WebRTC needs the webrtc extra"}}
    with open_page(live_server, mic_wav) as (page, _errors):
        page.route(
            f"**{CALL_PATH}",
            lambda route: route.fulfill(status=501, json=body, headers={"X-Test": "no-aiortc"}),
        )
        page.click("#start")
        page.wait_for_selector("main[data-state=connected]", timeout=10_000)
        assert page.get_attribute("#app", "data-transport") == "websocket"
        assert page.input_value("#transport") == "websocket"
        status = page.inner_text("#status")
        assert status.startswith("Listening"), status
        assert "Over the WebSocket: This server takes no WebRTC calls" in status, status
        assert "webrtc_unavailable" in status, status
        assert page.is_hidden("#alert")

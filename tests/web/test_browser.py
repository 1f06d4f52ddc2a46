"""The browser page (GET /), end to end in a real headless Chromium.

Debian's `chromium` hears tests/fixtures/command.wav through its fake microphone; the page
streams it to a real server (the default engines) and must show the words, play the reply
audio and report latency numbers. Playwright drives the system browser: no browser is
downloaded. Set VOXSERVE_PAGE_SCREENSHOT=docs/page.png to save the page after the round trip.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np
import pytest

from tests.conftest import LiveServer
from tests.helpers import fixture_audio

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = Path("/usr/bin/chromium")
# A URL with a scheme where a page loads something: src/href, import, fetch, addModule, url().
EXTERNAL = re.compile(r"""(src=|href=|from\s|fetch\(|addModule\(|url\()\s*["']?(https?:)?//""")


def _install_chromium() -> str | None:
    """Install Debian's chromium when it is missing (CI does so first); the reason when not."""
    if CHROMIUM.exists():
        return None
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return "/usr/bin/chromium is missing and apt-get is unavailable (or not root)"
    for args in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        done = subprocess.run(args, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            return (
                f"/usr/bin/chromium is missing and `{' '.join(args)}` failed: {done.stderr[-300:]}"
            )
    return None if CHROMIUM.exists() else "apt-get installed no /usr/bin/chromium"


@pytest.fixture(scope="module")
def chromium() -> Iterator[None]:
    reason = _install_chromium()
    if reason:
        pytest.skip(f"no browser for the page test: {reason}")
    yield


@pytest.fixture(scope="module")
def mic_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the fake microphone says: 0.5 s of silence, "What time is it?", 2 s of silence
    (16 kHz mono PCM16, which Chromium's fake capture reads and resamples itself)."""
    rate = 16_000
    speech = fixture_audio("command.wav")
    samples = np.concatenate(
        [np.zeros(rate // 2, np.int16), speech.astype(np.int16), np.zeros(2 * rate, np.int16)]
    )
    path = tmp_path_factory.mktemp("mic") / "command_padded.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.astype("<i2").tobytes())
    return path


def test_page_and_assets_are_served(live_server: LiveServer) -> None:
    base = live_server.http_url
    page = httpx.get(f"{base}/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/web/app.js">' in page.text
    for name, kind in [
        ("app.js", "text/javascript"),
        ("capture-worklet.js", "text/javascript"),
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


BROWSER_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]


@contextlib.contextmanager
def open_page(
    live_server: LiveServer, mic_wav: Path, *, allow_mic: bool = True
) -> Iterator[tuple[Page, list[str]]]:
    """Chromium with the fake microphone playing `mic_wav` once, on the page, ready to Start;
    yields the page and the console errors seen so far (a live list)."""
    from playwright.sync_api import sync_playwright

    args = [*BROWSER_ARGS, f"--use-file-for-fake-audio-capture={mic_wav}%noloop"]
    # Grant the microphone without a prompt, or refuse it as a user clicking "Block" would.
    args.append("--use-fake-ui-for-media-stream" if allow_mic else "--deny-permission-prompts")
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=args)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 700})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{live_server.http_url}/")
            page.wait_for_selector("main[data-options=loaded]", timeout=10_000)
            yield page, errors
        finally:
            browser.close()


def test_speak_to_the_page_in_chromium(
    live_server: LiveServer, chromium: None, mic_wav: Path
) -> None:
    started = time.monotonic()
    with open_page(live_server, mic_wav) as (page, errors):
        page.select_option("#mode", "assistant")
        page.click("#start")

        # The words in the transcript, and reply audio actually played (sources ended).
        page.wait_for_function(
            """() => {
                const t = document.getElementById("transcript").textContent.toLowerCase();
                const app = document.getElementById("app");
                return t.includes("time") && Number(app.dataset.replyPlayedMs) > 0;
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
        assert page.is_hidden("#alert")

        shot = os.environ.get("VOXSERVE_PAGE_SCREENSHOT")
        if shot:
            page.wait_for_timeout(2_100)  # one more server-panel refresh
            page.screenshot(path=shot)
        assert not errors, errors
    assert time.monotonic() - started < 40


def test_page_says_when_the_server_refuses_and_reconnects(
    live_server: LiveServer, chromium: None, mic_wav: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the session limit the server closes with 1013 `overloaded`: the page says so and
    tries again; once there is room it gets a session without a click."""
    monkeypatch.setattr(live_server.runtime.settings.limits, "max_sessions", 0)
    with open_page(live_server, mic_wav) as (page, _errors):
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

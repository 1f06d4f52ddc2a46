"""Chromium on the page (GET /) with the fake microphone, driven by Playwright: no browser
is downloaded, Debian's /usr/bin/chromium runs it (tests/web/conftest.py installs it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tests.conftest import LiveServer

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = Path("/usr/bin/chromium")

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
    """Chromium with the fake microphone playing `mic_wav` over and over, on the page, ready
    to Start; yields the page and the console errors seen so far (a live list).

    Over and over: the fake capture starts with getUserMedia, before the call or the
    WebSocket is up, and what it plays meanwhile is lost. Played once (`%noloop`), a setup
    longer than the file's leading 0.5 s of silence (a loaded machine: ICE, DTLS) cut
    "What" off the only utterance; looped, a whole one always follows the setup."""
    from playwright.sync_api import sync_playwright

    args = [*BROWSER_ARGS, f"--use-file-for-fake-audio-capture={mic_wav}"]
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

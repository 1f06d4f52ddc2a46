"""Fixtures of the browser page's tests: Debian's chromium, and what its fake microphone says."""

from __future__ import annotations

import os
import shutil
import subprocess
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import fixture_audio
from tests.web.browser import CHROMIUM


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
    """What the fake microphone says, again and again (tests/web/browser.py): 0.5 s of
    silence, "What time is it?", 2 s of silence (16 kHz mono PCM16, which Chromium's fake
    capture reads and resamples itself)."""
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

"""The WebRTC floor's bare peer (voxserve/bench/webrtc_echo.py), as scripts/bench_webrtc_floor.py
uses it: a real aiortc caller's POST is answered 201 with a Location, the caller's speech comes
back on the same track (decoded and encoded again: the codec work a floor must include), and
DELETE Location ends the call."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from scripts.bench_webrtc_floor import spawn_webrtc_echo
from voxserve.audio.wav import read_wav
from voxserve.bench.webrtc_client import (
    FRAME_SAMPLES,
    SOUND_RMS,
    WebRtcCaller,
    clip_source,
    to_48k,
)

ROOT = Path(__file__).resolve().parents[2]


def _recording() -> bytes:
    pcm, rate = read_wav((ROOT / "tests" / "fixtures" / "command.wav").read_bytes())
    return to_48k(pcm, rate)


def _sound_frames(pcm48: bytes) -> int:
    """20 ms frames above the caller's sound threshold (about -50 dBFS)."""
    samples = np.frombuffer(pcm48, dtype="<i2").astype(np.float64)
    frames = samples[: samples.size // FRAME_SAMPLES * FRAME_SAMPLES].reshape(-1, FRAME_SAMPLES)
    return int((np.sqrt((frames**2).mean(axis=1)) > SOUND_RMS).sum())


async def _call(base: str, recording: bytes) -> tuple[WebRtcCaller, int]:
    caller = WebRtcCaller(clip_source(recording), keep_audio=True)
    try:
        await caller.call(base, None)
        assert caller.location is not None and caller.location.startswith("/v1/realtime/calls/")
        await asyncio.sleep(2.5)  # the 2 s recording, and its echo
        status = await caller.hang_up()
    finally:
        await caller.close()
    return caller, status


def test_the_echo_peer_sends_the_callers_speech_back(tmp_path: Path) -> None:
    recording = _recording()
    with spawn_webrtc_echo(tmp_path / "echo.log") as (base, _pid):
        caller, status = asyncio.run(_call(base, recording))
    assert status == 200
    heard = caller.heard
    assert heard.frames >= 100  # 20 ms frames for the whole call: the track never pauses
    # The recording's sound came back as sound (Opus both ways blurs a frame or two).
    sent = _sound_frames(recording)
    assert sent >= 20
    assert 0.8 * sent <= heard.sound_frames <= 1.2 * sent, (sent, heard.sound_frames)

"""A few faults on the real engines (silero, whisper, piper), with a real healthy stream
alongside whose transcript is checked by word error rate: a client vanishing mid-utterance,
duplicated and reordered frames, malformed uploads, text over the limit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import SecretStr
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.faults.harness import ADMIN_KEY, back_to_baseline, counters_add_up, resources
from tests.helpers import FIXTURES, fixture_audio, fixture_texts, wer
from tests.wsclient import collect, frame_messages, of_type, send_audio
from voxserve.config import ExecutorConfig, load_settings

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def real_server() -> Iterator[LiveServer]:
    settings = load_settings(port=free_port(), log_level="error")
    pipeline = settings.pipeline.model_copy(
        update={"executor": ExecutorConfig(min_workers=4, max_workers=4, idle_release_s=3600)}
    )
    settings = settings.model_copy(update={"pipeline": pipeline, "admin_key": SecretStr(ADMIN_KEY)})
    live = start_server(settings)
    asyncio.run(_transcript(live, "command.wav"))  # warm: first calls load lazy state
    yield live
    stop_server(live)


async def _transcript(
    live: LiveServer, name: str, messages: list[bytes] | None = None
) -> tuple[str, dict[str, Any]]:
    """A real asr session over a fixture (or the given frame messages), at 4x real time."""
    audio = np.concatenate([fixture_audio(name), np.zeros(16_000, np.int16)])
    async with connect(live.ws_url) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "asr", "partials": False}))
        assert json.loads(await ws.recv())["type"] == "session.started"
        if messages is None:
            await send_audio(ws, audio, speedup=4)
        else:
            for n, message in enumerate(messages):
                await ws.send(message)
                if n % 10 == 9:
                    await asyncio.sleep(0.05)
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws, limit_s=60)
    assert not of_type(events, "error"), of_type(events, "error")
    text = " ".join(e["text"] for e in of_type(events, "transcript.final"))
    return text, of_type(events, "session.ended")[0]


async def _vanish_mid_utterance(live: LiveServer) -> None:
    async with connect(live.ws_url) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "assistant"}))
        assert json.loads(await ws.recv())["type"] == "session.started"
        speech = fixture_audio("long.wav")
        await send_audio(ws, speech[: speech.size // 2], speedup=4)
        ws.transport.abort()


async def test_real_client_vanishes_mid_utterance(real_server: LiveServer) -> None:
    baseline = await resources(real_server)
    healthy, _ = await asyncio.gather(
        _transcript(real_server, "weather.wav"), _vanish_mid_utterance(real_server)
    )
    text, ended = healthy
    assert wer(fixture_texts()["weather.wav"], text) <= 0.25, text
    counters_add_up(ended)
    await back_to_baseline(real_server, baseline, within_s=10)


async def test_real_duplicated_and_reordered_frames(real_server: LiveServer) -> None:
    audio = np.concatenate([fixture_audio("lights.wav"), np.zeros(16_000, np.int16)])
    frames = frame_messages(audio)
    for i in range(0, len(frames) - 1, 2):
        frames[i], frames[i + 1] = frames[i + 1], frames[i]
    messages = [m for frame in frames for m in (frame, frame)]
    baseline = await resources(real_server)
    (text, ended), (healthy, _) = await asyncio.gather(
        _transcript(real_server, "lights.wav", messages), _transcript(real_server, "weather.wav")
    )
    assert wer(fixture_texts()["lights.wav"], text) <= 0.25, text
    assert wer(fixture_texts()["weather.wav"], healthy) <= 0.25, healthy
    counters_add_up(ended, sent=len(messages))
    assert ended["duplicates"] == len(frames) and ended["reordered"] == len(frames) // 2
    await back_to_baseline(real_server, baseline, within_s=10)


def test_real_malformed_uploads_and_huge_text(real_server: LiveServer) -> None:
    url = real_server.http_url + "/v1/audio"
    good = (FIXTURES / "lights.wav").read_bytes()
    for bad in (b"", good[:30], good[:44] + b"\x01", b"RIFF" + bytes(200)):
        response = httpx.post(
            url + "/transcriptions", files={"file": ("a.wav", bad)}, data={"model": "whisper-1"}
        )
        assert response.status_code == 400, (bad[:8], response.text)
        assert response.json()["error"]["code"] in ("invalid_audio", "empty_audio")
    text = httpx.post(
        url + "/transcriptions", files={"file": ("a.wav", good)}, data={"model": "whisper-1"}
    ).json()["text"]
    assert wer(fixture_texts()["lights.wav"], text) <= 0.25, text
    huge = httpx.post(url + "/speech", json={"input": "word " * 1000, "voice": "joe"})
    assert (huge.status_code, huge.json()["error"]["code"]) == (400, "text_too_long")
    speech = httpx.post(
        url + "/speech", json={"input": "Still speaking.", "voice": "joe", "response_format": "wav"}
    )
    assert speech.status_code == 200 and len(speech.content) > 16_000

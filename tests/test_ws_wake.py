"""/v1/stream with a `wake_word`: ASR waits for the word, transcribes one command, then waits
again. Real server, real models; the words are spoken by the server's own TTS (piper joe)."""

from __future__ import annotations

import json

import numpy as np
from websockets.asyncio.client import connect

from tests.conftest import LiveServer
from tests.fakes import silence
from tests.helpers import fixture_audio, fixture_texts, spoken, wer
from tests.wsclient import of_type, run_asr, start


def int16(audio: np.ndarray) -> np.ndarray:
    return audio if audio.dtype == np.int16 else (audio * 32767).astype(np.int16)


async def test_only_the_command_after_the_wake_word_is_transcribed(
    live_server: LiveServer,
) -> None:
    runtime = live_server.runtime
    audio = np.concatenate(
        [
            int16(fixture_audio("weather.wav")),  # before the word: not transcribed
            int16(silence(0.8)),
            spoken(runtime, "Okay Nabu.", pad_s=0.2),
            int16(fixture_audio("lights.wav")),  # the command
            int16(silence(1.0)),
            int16(fixture_audio("command.wav")),  # after the command: the gate is closed
            int16(silence(0.8)),
        ]
    )
    _, _, events = await run_asr(
        live_server.ws_url, audio, speedup=8.0, wake_word="okay_nabu", partials=False
    )
    kinds = [e["type"] for e in events]
    (wake,) = of_type(events, "wake.detected")
    assert wake["name"] == "okay_nabu"
    word_ends_ms = (fixture_audio("weather.wav").size + 0.8 * 16_000 + 0.2 * 16_000) / 16
    assert word_ends_ms < wake["timestamp_ms"] < word_ends_ms + 1500, wake
    assert kinds.index("wake.detected") < kinds.index("vad.start")
    (final,) = of_type(events, "transcript.final")
    assert wer(fixture_texts()["lights.wav"], final["text"]) <= 0.2, final["text"]
    assert final["start_ms"] >= wake["timestamp_ms"] - 300  # the word itself is not in it


async def test_an_unknown_wake_word_is_refused_with_the_valid_ones(
    live_server: LiveServer,
) -> None:
    async with connect(live_server.ws_url) as ws:
        error = await start(ws, mode="asr", wake_word="hey_siri")
    assert error["type"] == "error" and error["code"] == "unknown_wake_word", error
    assert error["fatal"] and "okay_nabu" in error["message"], error
    async with connect(live_server.ws_url) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "tts", "wake_word": "alexa"}))
        error = json.loads(await ws.recv())
    assert error["code"] == "invalid_parameter", error


async def test_a_command_said_in_one_breath_with_the_word(live_server: LiveServer) -> None:
    audio = np.concatenate(
        [spoken(live_server.runtime, "Okay, Nabu, turn on the lights."), int16(silence(0.8))]
    )
    _, _, events = await run_asr(
        live_server.ws_url, audio, speedup=8.0, wake_word="okay_nabu", partials=False
    )
    assert len(of_type(events, "wake.detected")) == 1
    (final,) = of_type(events, "transcript.final")
    text = final["text"].lower()
    assert "lights" in text and "nabu" not in text, text

"""The OpenAI-compatible HTTP routes against a real server and real engines, driven by the
official `openai` SDK (so the compatibility claim is tested, not assumed) and by httpx."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import jiwer
import numpy as np
import openai
import pytest

from tests.conftest import LiveServer
from tests.helpers import tts_calls_after_disconnect
from voxserve.audio.wav import read_wav
from voxserve.server.session.openai_models import OPENAI_ASR_MODELS, OPENAI_TTS_MODELS

FIXTURES = Path(__file__).parent / "fixtures"
TIMING = re.compile(r"\d\d:\d\d:\d\d[,.]\d{3} --> \d\d:\d\d:\d\d[,.]\d{3}$")
SENTENCE = "Good morning, the weather today is sunny and warm, so we are going to the park."
THREE_SENTENCES = (
    "The train to the city leaves from platform four at nine in the morning. "
    "Please remember to bring your ticket and a warm coat, because it is cold outside. "
    "We will meet again at the station café right after lunch on Friday."
)


def wav_seconds(data: bytes) -> float:
    samples, rate = read_wav(data)
    return samples.size / rate


def normalise(text: str) -> str:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).strip()


def word_error_rate(expected: str, got: str) -> float:
    return float(jiwer.wer(normalise(expected), normalise(got)))


def fixture_texts() -> dict[str, str]:
    texts: dict[str, str] = json.loads((FIXTURES / "fixtures.json").read_text())
    return texts


# --- speech ---------------------------------------------------------------------------------


def test_speech_wav_via_sdk(client: openai.OpenAI) -> None:
    audio = client.audio.speech.create(
        model="tts-1", voice="joe", input=SENTENCE, response_format="wav"
    )
    data = audio.read()
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    samples, rate = read_wav(data)
    assert rate == 16_000  # settings.tts.output_sample_rate
    assert 1.5 < samples.size / rate < 8.0
    assert int(np.abs(samples).max()) > 1000  # speech, not silence


def test_speech_streams_via_sdk(client: openai.OpenAI) -> None:
    with client.audio.speech.with_streaming_response.create(
        model="tts-1-hd", voice="joe", input=THREE_SENTENCES, response_format="wav"
    ) as response:
        assert response.headers["content-type"] == "audio/wav"
        assert response.headers["x-voxserve-sample-rate"] == "16000"
        chunks = list(response.iter_bytes())
    assert len(chunks) > 1
    assert wav_seconds(b"".join(chunks)) > 5.0


def test_speech_speed_shortens_audio(client: openai.OpenAI) -> None:
    normal = client.audio.speech.create(
        model="tts-1", voice="joe", input=SENTENCE, speed=1.0, response_format="wav"
    )
    fast = client.audio.speech.create(
        model="tts-1", voice="joe", input=SENTENCE, speed=1.5, response_format="wav"
    )
    assert wav_seconds(fast.read()) < 0.85 * wav_seconds(normal.read())


def test_speech_pcm_is_24k_raw(client: openai.OpenAI, live_server: LiveServer) -> None:
    wav = client.audio.speech.create(
        model="tts-1", voice="joe", input=SENTENCE, response_format="wav"
    ).read()
    raw = client.audio.speech.with_raw_response.create(
        model="tts-1", voice="joe", input=SENTENCE, response_format="pcm"
    )
    pcm = raw.content
    assert raw.headers["content-type"] == "audio/pcm"
    assert raw.headers["x-voxserve-sample-rate"] == "24000"
    assert pcm[:4] != b"RIFF" and len(pcm) % 2 == 0
    assert len(pcm) / 2 / 24_000 == pytest.approx(wav_seconds(wav), rel=0.1)


def test_speech_sample_rate_extra(live_server: LiveServer) -> None:
    response = httpx.post(
        live_server.http_url + "/v1/audio/speech",
        json={"input": SENTENCE, "voice": "joe", "sample_rate": 48_000, "response_format": "wav"},
        timeout=60,
    )
    assert response.status_code == 200
    assert response.headers["x-voxserve-sample-rate"] == "48000"
    _, rate = read_wav(response.content)
    assert rate == 48_000


def test_speech_engine_model_picks_that_engine(live_server: LiveServer) -> None:
    """model="espeak" with no voice uses espeak's first voice; model omitted, the default."""
    url = live_server.http_url + "/v1/audio/speech"
    wav = {"response_format": "wav"}
    espeak = httpx.post(url, json={"model": "espeak", "input": SENTENCE, **wav}, timeout=60)
    default = httpx.post(url, json={"input": SENTENCE, **wav}, timeout=60)
    assert espeak.status_code == default.status_code == 200
    assert espeak.headers["x-voxserve-voice"] != "joe"
    assert default.headers["x-voxserve-voice"] == "joe"
    assert wav_seconds(espeak.content) > 1.0


def test_speech_first_bytes_arrive_early(live_server: LiveServer) -> None:
    """The response streams: the first audio arrives long before the whole reply is made.
    (A text no other test asks for: a cache hit would arrive whole at once.)"""
    text = "Streaming check. " + THREE_SENTENCES
    with httpx.Client(base_url=live_server.http_url, timeout=60) as http:
        http.get("/v1/voices")  # connection warm, so the timing is the server's
        started = time.perf_counter()
        first: float | None = None
        size = 0
        with http.stream(
            "POST", "/v1/audio/speech", json={"input": text, "voice": "joe"}
        ) as response:
            assert response.status_code == 200
            for chunk in response.iter_raw():
                if first is None and chunk:
                    first = time.perf_counter() - started
                size += len(chunk)
        total = time.perf_counter() - started
    assert first is not None and size > 44
    print(f"speech TTFB {first * 1000:.0f} ms, total {total * 1000:.0f} ms")
    assert first < 0.6 * total


def test_speech_disconnect_stops_synthesis(live_server: LiveServer) -> None:
    """Closing the connection after the first chunk stops the engine between chunks."""
    text = " ".join(f"This is sentence number {n} of a long reply." for n in range(1, 41))
    stage = live_server.runtime.stages.stage("tts")
    before = stage.calls
    settled, later = tts_calls_after_disconnect(
        live_server.http_url, stage, {"input": text, "voice": "joe"}
    )
    assert later == settled  # nothing is still being synthesised
    assert settled - before < 20  # far fewer than the 40+ chunk calls of the whole reply


# --- transcriptions -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lights.wav", "reminder.wav", "long.wav"])
def test_transcription_json_via_sdk(client: openai.OpenAI, name: str) -> None:
    with (FIXTURES / name).open("rb") as file:
        result = client.audio.transcriptions.create(model="whisper-1", file=file)
    assert word_error_rate(fixture_texts()[name], result.text) <= 0.15


def test_transcription_verbose_json_via_sdk(client: openai.OpenAI) -> None:
    name = "two_turns.wav"
    with (FIXTURES / name).open("rb") as file:
        result = client.audio.transcriptions.create(
            model="whisper-1",
            file=file,
            language="en",
            response_format="verbose_json",
            timestamp_granularities=["segment"],
            prompt="ignored",
            temperature=0.0,
        )
    assert word_error_rate(fixture_texts()[name], result.text) <= 0.15
    assert result.language == "english"  # OpenAI names it in full
    assert result.duration == pytest.approx(wav_seconds((FIXTURES / name).read_bytes()), abs=0.01)
    assert result.segments
    assert [s.id for s in result.segments] == list(range(len(result.segments)))
    for segment in result.segments:
        assert 0.0 <= segment.start <= segment.end <= result.duration + 0.05
    joined = " ".join(s.text for s in result.segments)
    assert word_error_rate(result.text, joined) <= 0.05


def test_transcription_text_via_sdk(client: openai.OpenAI) -> None:
    name = "weather.wav"
    with (FIXTURES / name).open("rb") as file:
        text = client.audio.transcriptions.create(
            model="whisper", file=file, response_format="text"
        )
    assert isinstance(text, str) and not text.lstrip().startswith("{")
    assert word_error_rate(fixture_texts()[name], text) <= 0.15


def test_transcription_srt_and_vtt(live_server: LiveServer) -> None:
    data = (FIXTURES / "command.wav").read_bytes()
    url = live_server.http_url + "/v1/audio/transcriptions"
    for fmt, first_line in (("srt", "1"), ("vtt", "WEBVTT")):
        response = httpx.post(
            url, files={"file": ("a.wav", data, "audio/wav")}, data={"response_format": fmt}
        )
        assert response.status_code == 200
        lines = response.text.splitlines()
        assert lines[0] == first_line
        assert any(
            re.match(r"\d\d:\d\d:\d\d[,.]\d{3} --> \d\d:\d\d:\d\d[,.]\d{3}$", ln) for ln in lines
        )


def test_speech_round_trips_through_transcription(client: openai.OpenAI) -> None:
    """The server's own speech, transcribed by the server, gives the text back."""
    audio = client.audio.speech.create(
        model="tts-1", voice="joe", input=SENTENCE, response_format="wav"
    ).read()
    result = client.audio.transcriptions.create(
        model="gpt-4o-mini-transcribe", file=("speech.wav", audio, "audio/wav")
    )
    assert word_error_rate(SENTENCE, result.text) <= 0.15


# --- voices and models ----------------------------------------------------------------------


def test_voices(live_server: LiveServer) -> None:
    body = httpx.get(live_server.http_url + "/v1/voices").json()
    ids = [v["id"] for v in body["voices"]]
    assert body["default"] == "joe" and "joe" in ids
    assert {v["engine"] for v in body["voices"]} >= {"piper", "espeak"}
    for voice in body["voices"]:
        fields = {"id", "engine", "language", "sample_rate", "description", "aliases"}
        assert set(voice) == fields | {"openai_aliases"}
        assert voice["sample_rate"] > 0
    joe = next(v for v in body["voices"] if v["id"] == "joe")
    assert joe["aliases"] == ["en_US-joe-medium"]
    by_alias = httpx.post(
        live_server.http_url + "/v1/audio/speech",
        json={"model": "tts-1", "voice": "en_US-joe-medium", "input": "Hi."},
    )
    assert by_alias.status_code == 200 and by_alias.headers["X-Voxserve-Voice"] == "joe"


def test_models_via_sdk(client: openai.OpenAI) -> None:
    models = client.models.list()
    ids = [m.id for m in models]
    assert set(OPENAI_TTS_MODELS) | set(OPENAI_ASR_MODELS) | {"piper", "espeak", "whisper"} <= set(
        ids
    )
    assert all(m.object == "model" and m.owned_by == "voxserve" for m in models)

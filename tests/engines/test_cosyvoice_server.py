"""A real voxserve server whose TTS engine is cosyvoice, in front of a stand-in of
CosyVoice's gRPC or FastAPI runtime (voxserve/standins/cosyvoice.py, tones from the
published protocol): /v1/audio/speech through the official `openai` SDK and a /v1/stream
session get the stand-in's audio, the first chunk before the runtime's stream ended; a
stalled runtime is a clear error to that session in time and the next reply works; a
zero-shot voice registered through the admin API survives a restart."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from pydantic import SecretStr
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.wsclient import collect, of_type, start
from voxserve.audio.wav import write_wav
from voxserve.config import EngineSpec, Settings, load_settings
from voxserve.standins.cosyvoice import GrpcStandin, HttpStandin, Standin

ADMIN_KEY = "cosy-admin"
TIMEOUT_S = 1.5
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def settings_for(url: str, voice_dir: Path) -> Settings:
    settings = load_settings(port=free_port(), log_level="warning")
    options = {
        "url": url,
        "voices": {"woman": {"spk_id": "中文女", "language": "zh"}},
        "timeout_s": TIMEOUT_S,
        "voice_dir": str(voice_dir),
    }
    engines = settings.engines.model_copy(
        update={
            "asr": EngineSpec(name="load"),  # not what these tests are about
            "tts": [EngineSpec(name="cosyvoice", options=options)],
            "default_voice": "woman",
        }
    )
    cache = settings.cache.model_copy(update={"enabled": False})  # every request reaches it
    return settings.model_copy(
        update={"engines": engines, "cache": cache, "admin_key": SecretStr(ADMIN_KEY)}
    )


@pytest.fixture(scope="module", params=["grpc", "http"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveServer, Standin]]:
    standin: Standin = GrpcStandin() if request.param == "grpc" else HttpStandin()
    standin.start()  # type: ignore[attr-defined]
    url = f"{request.param}://127.0.0.1:{standin.port}"
    live = start_server(settings_for(url, tmp_path_factory.mktemp("voices")))
    yield live, standin
    standin.release.set()
    stop_server(live)
    standin.stop()  # type: ignore[attr-defined]


def sdk(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.http_url + "/v1", api_key="x", max_retries=0, timeout=30)


def dominant_hz(pcm: bytes, rate: int) -> float:
    samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.fft.rfftfreq(samples.size, 1 / rate)[int(np.argmax(spectrum))])


def test_speech_streams_the_runtime_audio_as_it_comes(served: tuple[LiveServer, Standin]) -> None:
    live, standin = served
    standin.release.clear()
    ended = standin.ended
    with (
        sdk(live) as client,
        client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="woman", input="This one is gated.", response_format="pcm"
        ) as response,
    ):
        pieces = response.iter_bytes()
        first = next(pieces)
        assert first and standin.ended == ended  # audio out before the runtime's stream ended
        standin.release.set()
        pcm = first + b"".join(pieces)
    assert standin.ended == ended + 1
    assert standin.requests[-1]["tts_text"] == "This one is gated."
    assert len(pcm) / 2 / 24_000 == pytest.approx(0.3, abs=0.02)  # three 0.1 s chunks
    assert dominant_hz(pcm, 24_000) == pytest.approx(440, abs=5)


def test_a_busy_runtime_is_overloaded_for_that_request_only(
    served: tuple[LiveServer, Standin],
) -> None:
    live, _ = served
    with sdk(live) as client:
        with pytest.raises(openai.APIStatusError) as refused:
            client.audio.speech.create(model="tts-1", voice="woman", input="I am overloaded.")
        assert refused.value.status_code == 503
        assert refused.value.code == "overloaded" and "is at capacity" in refused.value.message
        audio = client.audio.speech.create(
            model="tts-1", voice="woman", input="Not now.", response_format="pcm"
        )
    assert len(audio.content) == 3 * 2400 * 2


async def test_a_stream_session_speaks_and_survives_a_stalled_runtime(
    served: tuple[LiveServer, Standin],
) -> None:
    live, standin = served
    standin.release.clear()
    async with connect(live.ws_url) as ws:
        await start(ws, mode="tts", voice="woman")
        await ws.send(json.dumps({"type": "text", "text": "This one stalls.", "flush": True}))
        events, _ = await collect(ws, until="error", limit_s=TIMEOUT_S + 5)
        error = of_type(events, "error")[0]
        assert error["code"] == "stage_timeout" and not error["fatal"]
        assert f"sent no audio for {TIMEOUT_S:g} s" in error["message"]
        await ws.send(json.dumps({"type": "text", "text": "Now speak.", "flush": True}))
        events, audio = await collect(ws, until="tts.end", limit_s=10)
        await ws.send(json.dumps({"type": "session.end"}))
        await collect(ws, limit_s=10)
    pcm = b"".join(audio)
    assert len(pcm) / 2 / 16_000 == pytest.approx(0.3, abs=0.02)
    assert dominant_hz(pcm, 16_000) == pytest.approx(440, abs=5)
    standin.release.set()


def register(live: LiveServer, voice: str, prompt_text: str, wav: bytes) -> httpx.Response:
    return httpx.post(
        f"{live.http_url}/admin/voices/cosyvoice",
        headers=ADMIN,
        data={"voice": voice, "prompt_text": prompt_text, "language": "en"},
        files={"prompt_wav": ("prompt.wav", wav, "audio/wav")},
        timeout=10,
    )


def voice_ids(live: LiveServer) -> set[str]:
    listed: dict[str, Any] = httpx.get(f"{live.http_url}/v1/voices", timeout=10).json()
    return {voice["id"] for voice in listed["voices"]}


def test_voice_registration_is_an_engine_capability(tmp_path: Path) -> None:
    """/admin/voices/{engine} knows no engine by name: a TTS engine without the capability
    (here `load`), or a name no engine has, is a clear invalid_parameter."""
    settings = settings_for("grpc://127.0.0.1:9", tmp_path / "voices")  # never called
    engines = settings.engines.model_copy(
        update={"tts": [EngineSpec(name="load")], "default_voice": "load"}
    )
    live = start_server(settings.model_copy(update={"engines": engines}))
    try:
        plain = httpx.get(f"{live.http_url}/admin/voices/load", headers=ADMIN, timeout=10)
        assert plain.status_code == 400, plain.text
        assert plain.json()["error"]["code"] == "invalid_parameter"
        assert "load engine does not register voices" in plain.json()["error"]["message"]
        absent = register(live, "alice", "", b"RIFF")
        assert absent.status_code == 400 and absent.json()["error"]["code"] == "invalid_parameter"
        assert "no TTS engine 'cosyvoice' is configured" in absent.json()["error"]["message"]
    finally:
        stop_server(live)


def test_a_zero_shot_voice_from_the_admin_api_survives_a_restart(tmp_path: Path) -> None:
    standin = GrpcStandin().start()
    settings = settings_for(f"grpc://127.0.0.1:{standin.port}", tmp_path / "voices")
    prompt = (np.sin(np.arange(48_000) / 7.0) * 9000).astype(np.int16)  # 1 s at 48 kHz
    live = start_server(settings)
    try:
        unauthorised = httpx.post(f"{live.http_url}/admin/voices/cosyvoice", timeout=10)
        assert unauthorised.status_code == 401
        made = register(live, "clone", "Hello there.", write_wav(prompt, 48_000))
        assert made.status_code == 201, made.text
        assert made.json()["voice"] == {
            "id": "clone",
            "engine": "cosyvoice",
            "language": "en",
            "sample_rate": 24_000,
            "description": "CosyVoice zero-shot voice",
            "aliases": [],
        }
        assert "clone" in voice_ids(live)
        short = register(live, "brief", "Hi.", write_wav(prompt[:4_800], 48_000))  # 0.1 s
        assert short.status_code == 400 and short.json()["error"]["code"] == "invalid_audio"
        assert "at least 1 s" in short.json()["error"]["message"]
        taken = register(live, "woman", "", write_wav(prompt, 48_000))
        assert taken.status_code == 400 and "voices table" in taken.json()["error"]["message"]
    finally:
        stop_server(live)
    live = start_server(settings.model_copy(update={"port": free_port()}))
    try:
        assert "clone" in voice_ids(live)
        with sdk(live) as client:
            client.audio.speech.create(model="tts-1", voice="clone", input="Still me.")  # type: ignore[arg-type]
        got = standin.requests[-1]
        assert got["kind"] == "zero_shot_request" and got["prompt_text"] == "Hello there."
        assert len(got["prompt_audio"]) == 2 * 16_000  # 1 s, resampled to CosyVoice's 16 kHz
        gone = httpx.delete(f"{live.http_url}/admin/voices/cosyvoice/clone", headers=ADMIN)
        assert gone.status_code == 200 and "clone" not in voice_ids(live)
        again = httpx.delete(f"{live.http_url}/admin/voices/cosyvoice/clone", headers=ADMIN)
        assert again.status_code == 400 and again.json()["error"]["code"] == "unknown_voice"
    finally:
        stop_server(live)
        standin.stop()
    assert not list((tmp_path / "voices").iterdir())

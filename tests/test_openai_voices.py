"""OpenAI's voice names on every OpenAI-compatible route (server/session/openai_voices.py): the
official `openai` SDK against real servers with the real piper and eSpeak voices, one on
the default rule and one with a configured table (`tts.openai_voices`), and `voxserve
serve` refusing a table that names a voice that is not installed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeAsr, FakeVad
from tests.helpers import reap, wait_ready
from tests.test_cli import assert_one_error_line, clean_env, run_cli
from voxserve.audio.wav import read_wav
from voxserve.config import CacheConfig, TtsConfig, load_settings
from voxserve.engines.espeak_tts import EspeakTts
from voxserve.engines.loaded import Engines
from voxserve.engines.piper_tts import PiperTts
from voxserve.engines.responders import EchoResponder
from voxserve.errors import ErrorCode
from voxserve.runtime import Runtime
from voxserve.server.realtime_api.session import installed_of, voice_id
from voxserve.server.session.openai_models import OPENAI_TTS_MODELS
from voxserve.server.session.openai_voices import OPENAI_VOICES

TABLE = {"alloy": "espeak-en", "nova": "joe", "echo": "en_US-joe-medium"}
TEXT = "Hello there."


def sdk(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.http_url + "/v1", api_key="x", max_retries=0, timeout=60)


def spoken(client: openai.OpenAI, voice: str, model: str = "tts-1") -> tuple[str, np.ndarray]:
    """The voice the server says spoke, and the audio (WAV asked for explicitly)."""
    raw = client.audio.speech.with_raw_response.create(
        model=model, voice=voice, input=TEXT, response_format="wav"
    )
    samples, _ = read_wav(raw.content)
    return raw.headers["X-Voxserve-Voice"], samples


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Correlation of two clips' average log spectra: near 1.0 for one voice saying the
    same text (eSpeak's samples differ a little run to run), lower for another voice."""

    def spectrum(x: np.ndarray) -> np.ndarray:
        n = 512
        frames = [x[i : i + n] * np.hanning(n) for i in range(0, x.size - n, n // 2)]
        s = np.log1p(np.abs(np.fft.rfft(np.array(frames, dtype=np.float64), axis=1)).mean(axis=0))
        return s - s.mean()

    s, t = spectrum(a), spectrum(b)
    return float(s @ t / (np.linalg.norm(s) * np.linalg.norm(t)))


@pytest.fixture(scope="module")
def table_server() -> Iterator[LiveServer]:
    """The real TTS voices with a table; no cache, so every answer is synthesised."""
    settings = load_settings(
        port=free_port(),
        log_level="warning",
        tts=TtsConfig(openai_voices=TABLE),
        cache=CacheConfig(enabled=False),
    )
    engines = Engines(FakeVad(), FakeAsr(), [PiperTts(), EspeakTts()], EchoResponder(), "joe")
    live = start_server(settings, Runtime.from_engines(settings, engines))
    yield live
    stop_server(live)


def test_every_openai_name_speaks_an_installed_voice(live_server: LiveServer) -> None:
    installed = {v.id for v in live_server.runtime.engines.voices()}
    with sdk(live_server) as client:
        for name in OPENAI_VOICES:
            voice, samples = spoken(client, name)
            assert voice in installed, name
            assert samples.size > 0 and int(np.abs(samples).max()) > 1000, name  # speech
        assert spoken(client, "alloy")[0] == "joe"  # the default rule: alloy = default voice


@pytest.mark.parametrize("model", OPENAI_TTS_MODELS)
def test_openai_models_are_accepted(live_server: LiveServer, model: str) -> None:
    with sdk(live_server) as client:
        assert spoken(client, "alloy", model)[0] == "joe"


def test_the_table_changes_which_voice_speaks(table_server: LiveServer) -> None:
    with sdk(table_server) as client:
        voice, alloy = spoken(client, "alloy")
        _, espeak = spoken(client, "espeak-en")
        _, joe = spoken(client, "joe")
        assert voice == "espeak-en"
        assert similarity(alloy, espeak) > 0.99  # the voice the table names
        assert similarity(alloy, joe) < 0.97  # not the default voice (0.90 measured)
        assert spoken(client, "nova")[0] == "joe"
        assert spoken(client, "echo")[0] == "joe"  # an engine's alias names its voice
        assert spoken(client, "joe")[0] == "joe"  # an installed id is taken as it is


def test_voice_as_a_custom_voice_object(table_server: LiveServer) -> None:
    reply = httpx.post(
        table_server.http_url + "/v1/audio/speech",
        json={"model": "tts-1", "voice": {"id": "espeak-en"}, "input": TEXT},
    )
    assert reply.status_code == 200 and reply.headers["X-Voxserve-Voice"] == "espeak-en"
    for bad in ({}, {"id": 5}, 5):
        reply = httpx.post(
            table_server.http_url + "/v1/audio/speech",
            json={"model": "tts-1", "voice": bad, "input": TEXT},
        )
        assert reply.status_code == 400, bad
        assert reply.json()["error"]["code"] == ErrorCode.INVALID_PARAMETER.value


def test_voices_list_the_openai_aliases(live_server: LiveServer, table_server: LiveServer) -> None:
    for live, alloy_voice in ((live_server, "joe"), (table_server, "espeak-en")):
        body = httpx.get(live.http_url + "/v1/voices").json()
        aliases = {v["id"]: v["openai_aliases"] for v in body["voices"]}
        listed = [name for names in aliases.values() for name in names]
        assert sorted(listed) == sorted(OPENAI_VOICES)  # every name, once
        assert "alloy" in aliases[alloy_voice]
        joe = next(v for v in body["voices"] if v["id"] == "joe")
        assert joe["aliases"] == ["en_US-joe-medium"]  # the existing fields are kept
    table = {v["id"]: v["openai_aliases"] for v in body["voices"]}
    assert {"nova", "echo"} <= set(table["joe"]) and "alloy" not in table["joe"]


def test_an_unknown_voice_is_a_400_listing_the_valid_names(table_server: LiveServer) -> None:
    with sdk(table_server) as client, pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(model="tts-1", voice="zed", input=TEXT, response_format="wav")
    assert caught.value.status_code == 400
    assert caught.value.code == ErrorCode.UNKNOWN_VOICE.value
    assert "zed" in caught.value.message
    assert "joe" in caught.value.message and "espeak-en" in caught.value.message
    assert "alloy" in caught.value.message and "cedar" in caught.value.message


def test_the_realtime_api_maps_through_the_same_table(table_server: LiveServer) -> None:
    runtime = table_server.runtime
    table = runtime.settings.tts.openai_voices  # as the Realtime routes pass it
    installed = installed_of(runtime.engines, runtime.settings.vad, table)
    assert voice_id("alloy", installed) == "espeak-en"
    assert voice_id("nova", installed) == "joe"
    assert voice_id("espeak-en", installed) == "espeak-en"
    plain = installed_of(runtime.engines, runtime.settings.vad)
    assert voice_id("alloy", plain) == "joe"  # no table: the default rule


@pytest.mark.parametrize(
    ("table", "needles"),
    [
        ({"alloy": "nobody"}, ("tts.openai_voices", "'alloy'", "'nobody'", "joe")),
        ({"alloyy": "joe"}, ("tts.openai_voices", "'alloyy'", "not an OpenAI voice name")),
    ],
)
def test_serve_refuses_a_table_naming_no_voice(
    tmp_path: Path, table: dict[str, str], needles: tuple[str, ...]
) -> None:
    config = tmp_path / "voxserve.json"
    config.write_text(json.dumps({"tts": {"openai_voices": table}}))
    ports = ("--port", "0", "--grpc-port", "0", "--wyoming-port", "0")  # none shared
    proc = run_cli("serve", "--config", str(config), *ports, timeout=60)
    assert proc.returncode == 2
    assert_one_error_line(proc, *needles)
    assert "http://" not in proc.stdout  # stopped before saying where to connect


def test_serve_with_a_table_speaks_the_voices_it_names(tmp_path: Path) -> None:
    """The CLI path: the TTS engines built for the check are the ones the server uses."""
    config = tmp_path / "voxserve.json"
    config.write_text(json.dumps({"tts": {"openai_voices": TABLE}}))
    port = free_port()
    args = ["serve", "--config", str(config), "--port", str(port), "--grpc-port", "0"]
    err_path = tmp_path / "stderr"
    with err_path.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voxserve", *args, "--wyoming-port", "0"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=clean_env(),
        )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(proc, port, err_path, timeout_s=90)
        with openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0) as client:
            assert spoken(client, "alloy")[0] == "espeak-en", err_path.read_text()
            assert spoken(client, "nova")[0] == "joe"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, err_path.read_text()
    finally:
        reap(proc)

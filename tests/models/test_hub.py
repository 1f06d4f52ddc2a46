"""engines/hub.py against the stand-in of the Hub: huggingface_hub's real client fetches,
voxserve verifies. A small synthetic repo (tests/models/conftest.py) keeps these fast; the
real Whisper is fetched in test_whisper_by_name.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.hub_standin import HubStandin
from tests.models.conftest import SMALL_REPO
from voxserve.engines.hub import (
    PROGRESS,
    FetchFailed,
    ModelMissing,
    Progress,
    cached_licence,
    cached_path,
    fetch_repo,
    hub_offline,
    remove_repo,
)

WANTED = ("config.json", "model.bin", "tokenizer.json")


def fetch(**kwargs: object) -> Path:
    return fetch_repo(SMALL_REPO, name="small", allow_patterns=WANTED, **kwargs)  # type: ignore[arg-type]


def assert_whole(folder: Path, files: dict[str, bytes]) -> None:
    """Exactly the wanted files, byte for byte."""
    assert sorted(p.name for p in folder.iterdir()) == sorted(WANTED)
    for name in WANTED:
        assert (folder / name).read_bytes() == files[name], name


def test_first_use_downloads_verifies_and_reports_progress(
    hf_env: Path, hub: HubStandin, small_repo: dict[str, bytes]
) -> None:
    seen: list[Progress] = []
    folder = fetch(on_progress=seen.append)
    assert_whole(folder, small_repo)
    assert folder.is_relative_to(hf_env / "hub")  # huggingface_hub's cache under HF_HOME
    total = sum(len(small_repo[n]) for n in WANTED)
    done = [p.done_bytes for p in seen]
    assert done == sorted(done) and done[-1] == total, done[-3:]
    assert {p.total_bytes for p in seen} == {total} and {p.name for p in seen} == {"small"}
    assert PROGRESS.snapshot() == []  # finished fetches leave the registry
    assert hub.content_gets("README.md") == 0  # allow_patterns honoured
    assert cached_licence(SMALL_REPO) == "apache-2.0"  # the model card's, kept for offline


def test_a_cached_repo_is_used_without_any_request(
    hf_env: Path, hub: HubStandin, small_repo: dict[str, bytes]
) -> None:
    first = fetch()
    before = len(hub.requests)
    hub.stop()  # not even a metadata request: nothing listens
    assert fetch() == first
    assert cached_path(SMALL_REPO, allow_patterns=WANTED) == first
    assert len(hub.requests) == before


@pytest.mark.parametrize("how", ["argument", "HF_HUB_OFFLINE", "VOXSERVE_OFFLINE"])
def test_offline_refuses_a_missing_model_with_the_pull_command(
    hf_env: Path,
    hub: HubStandin,
    small_repo: dict[str, bytes],
    how: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if how != "argument":
        monkeypatch.setenv(how, "1")
    assert hub_offline(how == "argument")
    with pytest.raises(ModelMissing) as missing:
        fetch(offline=how == "argument")
    assert str(missing.value) == "model 'small' is not downloaded; run: voxserve models pull small"
    assert hub.requests == []  # never asked


@pytest.mark.parametrize(
    ("path", "truncate"),
    [("model.bin", False), ("model.bin", True), ("config.json", False), ("tokenizer.json", True)],
)
def test_a_damaged_download_is_refused_and_fetched_again(
    hf_env: Path, hub: HubStandin, small_repo: dict[str, bytes], path: str, truncate: bool
) -> None:
    """Flipped bytes (same length: only the checksum tells, SHA-256 for LFS files, the git
    blob id for the rest) or a truncated body: the file is downloaded a second time."""
    hub.corrupt(SMALL_REPO, path, truncate=truncate)
    folder = fetch()
    assert_whole(folder, small_repo)
    assert hub.content_gets(path) == 2
    assert all(hub.content_gets(other) == 1 for other in WANTED if other != path)


def test_a_file_damaged_twice_fails_in_one_line_and_leaves_no_bad_copy(
    hf_env: Path, hub: HubStandin, small_repo: dict[str, bytes]
) -> None:
    hub.corrupt(SMALL_REPO, "model.bin", times=2)
    with pytest.raises(FetchFailed) as failed:
        fetch()
    message = str(failed.value)
    assert "\n" not in message and "model.bin" in message and "checksum" in message
    assert cached_path(SMALL_REPO, allow_patterns=WANTED) is None
    assert_whole(fetch(), small_repo)  # the next try succeeds


def test_a_cut_transfer_resumes_where_it_stopped(
    hf_env: Path, hub: HubStandin, small_repo: dict[str, bytes]
) -> None:
    """huggingface_hub's own resume: a Range request for the rest, not a new download."""
    hub.cut(SMALL_REPO, "model.bin")
    assert_whole(fetch(), small_repo)
    assert hub.content_gets("model.bin") == 2  # the cut one and the Range for the rest


def test_a_file_damaged_in_the_cache_is_fetched_again(
    hf_env: Path, hub: HubStandin, small_repo: dict[str, bytes]
) -> None:
    folder = fetch()
    blob = (folder / "model.bin").resolve()
    with blob.open("r+b") as f:
        f.truncate(1000)
    assert cached_path(SMALL_REPO, allow_patterns=WANTED) is None
    assert_whole(fetch(), small_repo)
    assert hub.content_gets("model.bin") == 2


def test_progress_is_in_the_registry_while_a_fetch_runs(
    hf_env: Path, hub: HubStandin, small_repo: dict[str, bytes]
) -> None:
    hub.hold(after_bytes=512 * 1024)
    done: list[Path] = []
    worker = threading.Thread(target=lambda: done.append(fetch()))
    worker.start()
    try:
        assert hub.wait_held()
        total = sum(len(small_repo[n]) for n in WANTED)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            items = [p for p in PROGRESS.snapshot() if p.repo_id == SMALL_REPO]
            if items and items[0].done_bytes > 0:  # the small files; model.bin is held
                break
            time.sleep(0.02)
        assert len(items) == 1, items
        assert items[0].name == "small" and 0 < items[0].done_bytes < total == items[0].total_bytes
    finally:
        hub.release()
        worker.join(30)
    assert done and not [p for p in PROGRESS.snapshot() if p.repo_id == SMALL_REPO]


RACE = """
import sys
from voxserve.engines.hub import fetch_repo
print(fetch_repo(sys.argv[1], name="small", allow_patterns=sys.argv[2:]))
"""


def test_two_processes_racing_one_pull_download_once(
    hf_env: Path, hub: HubStandin, small_repo: dict[str, bytes]
) -> None:
    """The second process waits on huggingface_hub's file lock, then reuses the file: one
    transfer of model.bin, one verified copy, both processes given the same folder."""
    hub.hold(after_bytes=256 * 1024)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-c", RACE, SMALL_REPO, *WANTED]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    try:
        assert hub.wait_held(60)
        deadline = time.monotonic() + 60
        while hub.requests.count(("HEAD", f"/{SMALL_REPO}/resolve/{_sha(hub)}/model.bin")) < 2:
            assert time.monotonic() < deadline, hub.requests
            time.sleep(0.05)
        time.sleep(0.3)  # the second is at the lock now
    finally:
        hub.release()
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    folders = {Path(out.strip()) for out, _ in outs}
    assert len(folders) == 1
    assert_whole(folders.pop(), small_repo)
    assert hub.content_gets("model.bin") == 1
    blobs = list((hf_env / "hub" / "models--test-org--small-model" / "blobs").iterdir())
    digest = hashlib.sha256(small_repo["model.bin"]).hexdigest()
    assert [b.name for b in blobs if b.stat().st_size == len(small_repo["model.bin"])] == [digest]
    assert not [b for b in blobs if b.name.endswith(".incomplete")]


def _sha(hub: HubStandin) -> str:
    return hub._repos[SMALL_REPO].sha


@pytest.mark.parametrize(
    ("repo", "needle"),
    [("nobody/no-such-model", "no such model repository"), (SMALL_REPO, "HTTP 503")],
)
def test_hub_errors_are_one_line(
    hf_env: Path, hub: HubStandin, small_repo: dict[str, bytes], repo: str, needle: str
) -> None:
    if repo == SMALL_REPO:
        hub.fail_next(20, status=503)
    with pytest.raises(FetchFailed) as failed:
        fetch_repo(repo, name="x", allow_patterns=WANTED)
    assert "\n" not in str(failed.value) and needle in str(failed.value), str(failed.value)


def test_an_unreachable_hub_says_how_to_fetch(
    hf_env: Path, hub: HubStandin, small_repo: dict[str, bytes]
) -> None:
    hub.stop()
    with pytest.raises(FetchFailed) as failed:
        fetch()
    message = str(failed.value)
    assert "\n" not in message and "voxserve models pull small" in message
    assert "HF_ENDPOINT" in message


def test_remove_repo_frees_the_bytes(
    hf_env: Path, hub: HubStandin, small_repo: dict[str, bytes]
) -> None:
    fetch()
    freed = remove_repo(SMALL_REPO)
    assert freed >= sum(len(small_repo[n]) for n in WANTED)
    assert remove_repo(SMALL_REPO) == 0
    assert cached_path(SMALL_REPO, allow_patterns=WANTED) is None


def test_the_manifest_records_what_was_verified(
    hf_env: Path, hub: HubStandin, small_repo: dict[str, bytes]
) -> None:
    folder = fetch()
    notes = folder.parent.parent / ".voxserve"
    manifest = json.loads((notes / f"{folder.name}.json").read_text())
    assert (
        manifest["files"]["model.bin"]["sha256"]
        == hashlib.sha256(small_repo["model.bin"]).hexdigest()
    )
    assert set(manifest["files"]) == set(WANTED)
    assert len(list((notes / "verified").iterdir())) == len(WANTED)


def test_a_cache_filled_by_huggingface_hub_alone_serves_offline(
    hf_env: Path, hub: HubStandin, small_repo: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An air-gapped host's cache filled by `hf download` (huggingface_hub itself, no
    voxserve notes): offline, its own tree listing gives the digests, and the files are
    checked against them before use."""
    from huggingface_hub import snapshot_download

    folder = Path(
        snapshot_download(
            SMALL_REPO,
            cache_dir=str(hf_env / "hub"),
            endpoint=hub.url,
            allow_patterns=list(WANTED),
        )
    )
    hub.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    blob = (folder / "tokenizer.json").resolve()
    blob.write_bytes(b"[" + small_repo["tokenizer.json"][1:])  # same size, other bytes
    with pytest.raises(ModelMissing) as damaged:
        fetch()
    assert str(damaged.value) == (
        "model 'small' is damaged in the cache (tokenizer.json fails its checksum); "
        "run: voxserve models pull small"
    )
    blob.write_bytes(small_repo["tokenizer.json"])
    assert fetch() == folder  # the Hub is down: only the cache could answer

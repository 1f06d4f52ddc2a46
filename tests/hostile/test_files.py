"""Config and files: what voxserve writes to disk is private whatever the umask, and a
directory it cannot write is one clear line at start. A real `voxserve serve` subprocess
(the umask is the process's) caches speech, mints a client secret (`openai` SDK) and keeps
its sqlite files open while every directory and file it made is checked; voice prompts and
an older install's files through their own stores."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from openai import OpenAI

from tests.conftest import free_port
from tests.helpers import stop_process, wait_ready
from voxserve.cache.store import SqliteStore
from voxserve.engines.cosyvoice_voices import ZeroShotStore

ROOT = Path(__file__).resolve().parents[2]
KEY = "hostile-files-key"
SERVE = [sys.executable, "-m", "voxserve", "serve", "--config", "bench/load-engines.toml"]


def not_private(top: Path) -> dict[str, str]:
    """Every directory under `top` (itself included) that is not 0700, every file not 0600."""
    wrong = {}
    for path in [top, *top.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode != (0o700 if path.is_dir() else 0o600):
            wrong[str(path.relative_to(top.parent))] = oct(mode)
    return wrong


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@contextlib.contextmanager
def serving(home: Path, mask: int, *extra: str) -> Iterator[str]:
    """A `voxserve serve` with $XDG_CACHE_HOME `home` under umask `mask`: its base URL."""
    port = free_port()
    env = {**os.environ, "XDG_CACHE_HOME": str(home), "VOXSERVE_API_KEYS": KEY}
    log = home.parent / f"server-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*SERVE, "--port", str(port), "--log-format", "text", *extra],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            umask=mask,
        )
    try:
        workers = int(extra[extra.index("--workers") + 1]) if "--workers" in extra else 1
        wait_ready(proc, port, log, workers=workers)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


def cached_rows(home: Path) -> int:
    rows = 0
    for path in home.rglob("tts-cache.sqlite3"):
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows += int(db.execute("SELECT COUNT(*) FROM entries").fetchone()[0])
        except sqlite3.OperationalError:  # not made yet
            pass
        finally:
            db.close()
    return rows


@pytest.mark.parametrize(
    ("mask", "workers"), [(0o000, "2"), (0o022, "1")], ids=["umask000-workers2", "umask022"]
)
def test_everything_the_server_writes_is_private(tmp_path: Path, mask: int, workers: str) -> None:
    """Finding 14: the cache dir was 0755 and its sqlite files 0644 (every key's spoken text
    and audio, session instructions, readable by any local user)."""
    home = tmp_path / "xdg"  # missing: voxserve makes it, and everything under it
    with serving(home, mask, "--workers", workers) as base:
        body = {"input": "A private sentence.", "response_format": "pcm", "sample_rate": 16000}
        headers = {"authorization": f"Bearer {KEY}"}
        for _ in range(2):  # with two workers, each may cache it
            answer = httpx.post(f"{base}/v1/audio/speech", json=body, headers=headers, timeout=30)
            assert answer.status_code == 200, answer.text
        with OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0) as client:
            client.realtime.client_secrets.create(
                session={"type": "realtime", "instructions": "Private instructions."}
            )
        deadline = time.monotonic() + 10
        while cached_rows(home) == 0 and time.monotonic() < deadline:  # the writer thread
            time.sleep(0.05)
        assert cached_rows(home) >= 1
        made = {p.name for p in home.rglob("*")}
        assert {"tts-cache.sqlite3", "tts-cache.lock", "client-secrets.sqlite3"} <= made
        assert any(name.endswith("-wal") for name in made), made  # open: WAL and shm there
        assert not_private(home) == {}
    assert not_private(home) == {}


def test_voice_prompts_are_private(tmp_path: Path) -> None:
    """A registered voice's prompt is someone's recording (its directory too)."""
    with umask(0):
        store = ZeroShotStore(tmp_path / "voices" / "cosyvoice", 24_000)
        store.add("caller", np.zeros(16_000, dtype=np.int16), "Hello there.", "en")
    assert not_private(tmp_path / "voices") == {}
    assert {p.name for p in (tmp_path / "voices" / "cosyvoice").iterdir()} == {
        "caller.wav",
        "caller.json",
    }


def test_an_older_installs_cache_files_are_tightened(tmp_path: Path) -> None:
    """Files an earlier version left 0644 are made 0600 when the cache opens them."""
    path = tmp_path / "tts-cache.sqlite3"
    with umask(0o022):
        db = sqlite3.connect(path)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (x)")
        db.execute("INSERT INTO t VALUES (1)")
        db.commit()
        db.close()
        (tmp_path / "tts-cache.sqlite3-wal").touch()  # as a crash leaves it
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    store = SqliteStore(path)
    store.load(time.time(), 1 << 20)
    for name in ("tts-cache.sqlite3", "tts-cache.sqlite3-wal", "tts-cache.sqlite3-shm"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    store.close()


def blocked_dirs(tmp_path: Path) -> list[Path]:
    """Cache directories `serve` cannot write: a file in the way always; a read-only
    directory too where permissions bind (not for root)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    found = [blocker / "cache"]
    if os.geteuid() != 0:
        read_only = tmp_path / "read-only"
        read_only.mkdir(mode=0o500)
        found.append(read_only / "cache")
    return found


def test_a_cache_dir_serve_cannot_write_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Finding 13: the server started, then minting was a 500 and an `ek_` on /v1/realtime
    dropped the connection."""
    for directory in blocked_dirs(tmp_path):
        done = subprocess.run(
            [*SERVE, "--port", str(free_port()), "--cache-dir", str(directory)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("voxserve: error: the client-secret store "), lines
        assert str(directory) in lines[0] and "--cache-dir" in lines[0]

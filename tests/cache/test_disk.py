"""The cache on disk: a restart recovers it, its bound holds on disk, a torn or damaged row
is never served, one server per directory."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.cache.helpers import Clock, key, pcm, tts_cache
from voxserve.cache.store import SqliteStore
from voxserve.cache.tts_cache import TtsCache


def disk_cache(directory: Path, clock: Clock | None = None, **config: object) -> TtsCache:
    return tts_cache(directory, clock, seed=3, **config)


def db_path(directory: Path) -> Path:
    return directory / "tts-cache.sqlite3"


def on_disk(directory: Path) -> tuple[int, int]:
    """(rows, audio bytes) in the file, read by a connection of its own."""
    store = SqliteStore(db_path(directory))
    try:
        return store.count()
    finally:
        store.close()


async def test_a_restart_recovers_entries_and_their_lru_order(tmp_path: Path) -> None:
    clock = Clock()
    first = disk_cache(tmp_path, clock)
    await first.load()
    audio = {f"line {i}": pcm(3000, seed=i) for i in range(5)}
    for text, data in audio.items():
        first.store(key(text), data)
    clock.advance(1)
    assert first.lookup(key("line 0")) is not None  # line 0 becomes the most recent
    await first.aclose()  # writes what is queued, touches included

    second = disk_cache(tmp_path, clock)
    report = await second.load()
    assert len(report.entries) == 5 and second.stats().loaded_entries == 5
    for text, data in audio.items():
        clock.advance(1)
        entry = second.lookup(key(text))
        assert entry is not None and entry.pcm == data
    assert second.lru.keys()[-1] == key("line 4").digest  # looked up last just now
    await second.aclose()
    third = disk_cache(tmp_path, clock, max_bytes=6000)  # a smaller bound: the LRU go
    await third.load()
    assert len(third.lru) == 2
    assert set(third.lru.keys()) == {key("line 4").digest, key("line 3").digest}
    await third.aclose()
    assert on_disk(tmp_path) == (2, 6000)  # deleted on disk too


async def test_expired_entries_are_not_loaded_and_are_deleted(tmp_path: Path) -> None:
    clock = Clock()
    cache = disk_cache(tmp_path, clock, ttl_s=60.0, jitter=0.0)
    await cache.load()
    cache.store(key("old"), pcm(100))
    await cache.aclose()
    clock.advance(61)
    again = disk_cache(tmp_path, clock)
    report = await again.load()
    assert report.expired == 1 and again.lookup(key("old")) is None
    await again.aclose()
    assert on_disk(tmp_path) == (0, 0)


async def test_the_byte_bound_holds_on_disk(tmp_path: Path) -> None:
    limit = 1_000_000
    cache = disk_cache(tmp_path, max_bytes=limit)
    await cache.load()
    for i in range(60):  # 3.8 MB through a 1 MB cache
        cache.store(key(f"reply {i}"), pcm(64_000, seed=i))
        if i % 10 == 0:
            assert cache.flush()
            store = SqliteStore(db_path(tmp_path))
            assert store.count()[1] <= limit
            assert store.file_bytes() <= limit * 1.1 + 4 * 1024 * 1024  # + the WAL's bound
            store.close()
    assert cache.stats().evictions == 60 - limit // 64_000
    await cache.aclose()
    store = SqliteStore(db_path(tmp_path))
    assert store.count() == (limit // 64_000, (limit // 64_000) * 64_000)
    assert store.file_bytes() <= limit * 1.1 + 64 * 1024  # freed pages are reused; no WAL
    store.close()


async def test_a_damaged_row_is_dropped_never_served(tmp_path: Path) -> None:
    cache = disk_cache(tmp_path)
    await cache.load()
    good, flipped, bad_sum = pcm(4000, 1), pcm(4000, 2), pcm(4000, 3)
    cache.store(key("good"), good)
    cache.store(key("flipped"), flipped)
    cache.store(key("bad sum"), bad_sum)
    await cache.aclose()
    with sqlite3.connect(db_path(tmp_path)) as db:  # what a bad disk or a hand edit does
        damaged = bytes([flipped[0] ^ 0xFF]) + flipped[1:]
        db.execute("UPDATE entries SET pcm=? WHERE key=?", (damaged, key("flipped").digest))
        db.execute("UPDATE entries SET checksum=checksum+1 WHERE key=?", (key("bad sum").digest,))
    again = disk_cache(tmp_path)
    report = await again.load()
    assert report.corrupt == 2
    assert again.lookup(key("flipped")) is None and again.lookup(key("bad sum")) is None
    found = again.lookup(key("good"))
    assert found is not None and found.pcm == good
    await again.aclose()
    assert on_disk(tmp_path)[0] == 1  # the damaged rows are gone


async def test_a_truncated_file_starts_over_and_serves_nothing_wrong(tmp_path: Path) -> None:
    cache = disk_cache(tmp_path)
    await cache.load()
    audio = {f"entry {i}": pcm(20_000, seed=i) for i in range(20)}
    for text, data in audio.items():
        cache.store(key(text), data)
    await cache.aclose()
    path = db_path(tmp_path)
    with path.open("r+b") as f:  # a torn copy, a full disk mid-write
        f.truncate(path.stat().st_size // 2)
    again = disk_cache(tmp_path)
    await again.load()
    for text, data in audio.items():
        entry = again.lookup(key(text))
        assert entry is None or entry.pcm == data
    again.store(key("after"), pcm(100, 9))  # and the cache works again, on disk too
    await again.aclose()
    third = disk_cache(tmp_path)
    await third.load()
    assert third.lookup(key("after")) is not None
    await third.aclose()


WRITER = """
import os, random, sys, time
sys.path.insert(0, {root!r})
from voxserve.cache.entry import Entry
from voxserve.cache.store import Put, SqliteStore
store = SqliteStore(__import__("pathlib").Path({path!r}))
store.apply([])
print("ready", flush=True)
rng = random.Random(1)
i = 0
while True:  # batches of 8 entries per transaction until killed
    batch = []
    for _ in range(8):
        data = rng.randbytes(40_000)
        batch.append(Put(Entry(f"k{{i}}", "v", f"t{{i}}", 16000, data, 0.0, 1e12), 0.0))
        i += 1
    if {exit_mid_transaction}:
        store.db.execute("BEGIN IMMEDIATE")
        store.db.execute("INSERT INTO entries VALUES ('torn','v','t',16000,x'00',1,0,0,1e12,0)")
        os._exit(1)  # a crash inside the transaction: no COMMIT
    store.apply(batch)
"""


def run_writer(directory: Path, *, exit_mid_transaction: bool) -> None:
    """A process that writes the cache and dies mid-write (SIGKILL or exit in a transaction)."""
    directory.mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parents[2])
    code = WRITER.format(
        root=root, path=str(db_path(directory)), exit_mid_transaction=exit_mid_transaction
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    if not exit_mid_transaction:
        time.sleep(0.4)  # many transactions in, one probably half done
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


async def test_a_write_torn_by_a_crash_is_never_served(tmp_path: Path) -> None:
    run_writer(tmp_path / "exit", exit_mid_transaction=True)
    cache = disk_cache(tmp_path / "exit")
    report = await cache.load()
    assert report.corrupt == 0 and not report.reset
    assert "torn" not in cache.lru and len(cache.lru) == 0  # the uncommitted row is not there
    await cache.aclose()

    run_writer(tmp_path / "kill", exit_mid_transaction=False)
    cache = disk_cache(tmp_path / "kill")
    report = await cache.load()
    assert len(report.entries) > 0 and report.corrupt == 0
    assert len(report.entries) % 8 == 0  # whole transactions only, never part of one
    await cache.aclose()


async def test_one_server_per_directory(tmp_path: Path) -> None:
    owner = disk_cache(tmp_path)
    await owner.load()
    second = disk_cache(tmp_path)
    await second.load()
    assert owner.stats().persistent and not second.stats().persistent  # memory-only
    second.store(key("mine"), pcm(100))
    await second.aclose()
    await owner.aclose()
    third = disk_cache(tmp_path)
    await third.load()
    assert third.stats().persistent and third.lookup(key("mine")) is None
    await third.aclose()

"""A full disk under the cache (simulated with sqlite's `max_page_count`): the real cause is
what fails and what is logged, once per run of failures, never sqlite's secondary "cannot
rollback - no transaction is active"; writes resume once there is room."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from tests.cache.helpers import pcm
from voxserve.cache.entry import Entry
from voxserve.cache.store import Put, SqliteStore
from voxserve.cache.writer import DiskWriter

ENTRY_BYTES = 200_000  # ~50 pages of 4 KiB: never fits in the room left below


def entry(n: int) -> Entry:
    return Entry(f"key-{n}", "fake", f"sentence {n}", 16_000, pcm(ENTRY_BYTES, n), 0.0, 1e12)


def full_store(path: Path) -> SqliteStore:
    """A store whose file may grow by two pages: the next entry fills the "disk"."""
    store = SqliteStore(path)
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count={pages + 2}")
    return store


def test_a_full_disk_fails_with_its_own_error(tmp_path: Path) -> None:
    store = full_store(tmp_path / "cache.sqlite3")
    with pytest.raises(sqlite3.OperationalError) as failed:
        store.apply([Put(entry(1), 0.0)])
    assert failed.value.sqlite_errorname == "SQLITE_FULL"  # was: "cannot rollback"
    assert not store.db.in_transaction
    assert store.count() == (0, 0)  # nothing half written; the store is usable
    store.close()


def test_the_writer_logs_the_cause_once_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = full_store(tmp_path / "cache.sqlite3")
    writer = DiskWriter(store, max_pending_bytes=10 * ENTRY_BYTES)
    writer.start()
    try:
        with caplog.at_level(logging.INFO, logger="voxserve.cache.writer"):
            for n in range(3):  # three batches, each failing
                writer.put(entry(n), 0.0)
                assert writer.flush()
            assert (writer.errors, writer.written) == (3, 0)
            store.db.execute("PRAGMA max_page_count=1000000")  # room again
            writer.put(entry(3), 0.0)
            assert writer.flush()
    finally:
        writer.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert warnings[0].__dict__["error"] == "SQLITE_FULL"
    assert "full" in warnings[0].__dict__["reason"]
    assert "cannot rollback" not in caplog.text
    assert "sentence" not in caplog.text  # no entry's text in the log
    assert any("work again" in r.getMessage() for r in caplog.records)
    assert writer.written == 1
    store.close()
    reopened = SqliteStore(tmp_path / "cache.sqlite3")
    assert reopened.count() == (1, ENTRY_BYTES)
    reopened.close()

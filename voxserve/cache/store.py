"""The cache on local disk: one sqlite file in WAL mode, every write in a transaction.

sqlite gives what a home-made format would have to earn: a write that is torn by a crash is
rolled back at the next open, never half-read. A crc32 per row is checked when the file is
loaded, so a row damaged any other way (a bad disk, a hand edit) is deleted, not served; a
file sqlite cannot read at all is replaced by an empty one (it is only a cache).
An entry's encoded variants (mp3, opus, ...) are rows of `variants`, keyed by the entry's
key and the variant's name, with the crc32 of the PCM they were made from: deleting an
entry deletes them, and a variant whose PCM is not the entry's is never loaded.
Not thread-safe: one thread at a time uses a store (the loader, then the writer thread).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from voxserve.cache.entry import Entry, checksum
from voxserve.private_files import private_sqlite

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
WAL_PAGES = 256  # 1 MB of 4 KB pages
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY, voice TEXT NOT NULL, text_norm TEXT NOT NULL,
    sample_rate INTEGER NOT NULL, pcm BLOB NOT NULL, nbytes INTEGER NOT NULL,
    checksum INTEGER NOT NULL, created REAL NOT NULL, expires REAL NOT NULL,
    last_access REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS variants (
    key TEXT NOT NULL, name TEXT NOT NULL, data BLOB NOT NULL, checksum INTEGER NOT NULL,
    pcm_checksum INTEGER NOT NULL, PRIMARY KEY (key, name)
);
"""
_COLUMNS = "key, voice, text_norm, sample_rate, pcm, nbytes, checksum, created, expires"


@dataclass(frozen=True, slots=True)
class Put:
    entry: Entry
    last_access: float


@dataclass(frozen=True, slots=True)
class PutVariant:
    """An encoding of an entry's PCM (`pcm_checksum`: that PCM's crc32)."""

    key: str
    name: str
    data: bytes
    pcm_checksum: int


@dataclass(frozen=True, slots=True)
class Delete:
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Invalidate:
    """Rows of one voice, or whose text starts with a prefix, or both; neither: every row."""

    voice: str | None = None
    text_prefix: str | None = None


@dataclass(frozen=True, slots=True)
class Touch:
    last_access: dict[str, float]


Op = Put | PutVariant | Delete | Invalidate | Touch


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What a start-up found on disk. `entries` are least recently used first."""

    entries: tuple[Entry, ...] = ()
    loaded_bytes: int = 0
    corrupt: int = 0
    expired: int = 0
    over_limit: int = 0
    reset: bool = False  # the file was unreadable and was replaced by an empty one
    seconds: float = 0.0


class SqliteStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = self._connect()
        return self._db

    def _connect(self) -> sqlite3.Connection:
        private_sqlite(self.path)  # 0600 (and its -wal, -shm): every key's text and audio
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10)
        try:
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # only takes on a new file
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a crash loses, never tears
            # The WAL is checkpointed into the file at 1 MB and cut back to 1 MB after, so
            # the disk holds at most ~max_bytes + 1 MB + one batch (writer.BATCH_BYTES).
            db.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
            db.execute(f"PRAGMA journal_size_limit={WAL_PAGES * 4096}")
            db.executescript(_SCHEMA)
            found = db.execute("SELECT value FROM meta WHERE name='schema'").fetchone()
            if found is None:
                db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif found[0] != str(SCHEMA_VERSION):
                db.execute("DELETE FROM entries")
                db.execute("UPDATE meta SET value=? WHERE name='schema'", (str(SCHEMA_VERSION),))
        except BaseException:
            db.close()
            raise
        return db

    def load(self, now: float, max_bytes: int) -> LoadReport:
        """Read every live row, most recently used first, until `max_bytes`; delete the
        expired, the corrupt and what no longer fits. An unreadable file starts over."""
        started = time.perf_counter()
        try:
            report = self._load(now, max_bytes)
        except sqlite3.DatabaseError as exc:
            log.warning("tts cache file unreadable; starting empty", extra={"error": str(exc)})
            self.reset()
            report = LoadReport(reset=True)
        return replace(report, seconds=time.perf_counter() - started)

    def _load(self, now: float, max_bytes: int) -> LoadReport:
        kept: list[Entry] = []
        dropped: list[str] = []
        total = corrupt = expired = over = 0
        variants, stale = self._variants()  # stale: damaged, or of other PCM than the entry's
        rows = self.db.execute(f"SELECT {_COLUMNS} FROM entries ORDER BY last_access DESC")
        for key, voice, text_norm, rate, pcm, nbytes, crc, created, expires in rows:
            if not isinstance(pcm, bytes) or len(pcm) != nbytes or checksum(pcm) != crc:
                corrupt += 1
            elif expires <= now:
                expired += 1
            else:
                found = variants.pop(key, {})
                made = {name: data for name, (data, of) in found.items() if of == crc}
                stale += [(key, name) for name in found if name not in made]
                entry = Entry(key, voice, text_norm, rate, pcm, created, expires)
                if made:
                    entry = replace(entry, variants=MappingProxyType(made))
                if total + entry.nbytes > max_bytes:
                    over += 1
                else:
                    total += entry.nbytes
                    kept.append(entry)
                    continue
            dropped.append(key)
        orphans = tuple(variants)  # variants of no entry kept (deleted by an older server)
        if dropped or orphans:
            self.apply([Delete(tuple(dropped) + orphans)])
        if stale:
            self.db.executemany("DELETE FROM variants WHERE key=? AND name=?", stale)
        if corrupt:
            log.warning("tts cache rows failed their checksum; deleted", extra={"rows": corrupt})
        kept.reverse()
        return LoadReport(tuple(kept), total, corrupt, expired, over)

    def _variants(self) -> tuple[dict[str, dict[str, tuple[bytes, int]]], list[tuple[str, str]]]:
        """Every intact variant row (entry key -> name -> (data, crc32 of its PCM)), and
        the (key, name) of every damaged one."""
        found: dict[str, dict[str, tuple[bytes, int]]] = {}
        damaged: list[tuple[str, str]] = []
        rows = self.db.execute("SELECT key, name, data, checksum, pcm_checksum FROM variants")
        for key, name, data, crc, pcm_crc in rows:
            if isinstance(data, bytes) and checksum(data) == crc:
                found.setdefault(key, {})[name] = (data, pcm_crc)
            else:
                damaged.append((key, name))
        return found, damaged

    def apply(self, ops: Sequence[Op]) -> None:
        """All of `ops`, in order, in one transaction: all happen or none."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            shrink = False
            for op in ops:
                shrink = self._apply_one(db, op) or shrink
            db.execute("COMMIT")
        except BaseException:
            # sqlite rolls a transaction back by itself on some errors (SQLITE_FULL: a full
            # disk); a ROLLBACK then fails too ("no transaction is active") and its error
            # would replace the cause. The cause is what goes up.
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise
        if shrink:
            db.execute("PRAGMA incremental_vacuum")  # give bulk-freed pages back to the disk

    def _apply_one(self, db: sqlite3.Connection, op: Op) -> bool:
        """Run one op; True when it may have freed many pages."""
        if isinstance(op, Put):
            e = op.entry
            row = (e.key, e.voice, e.text_norm, e.sample_rate, e.pcm, len(e.pcm), checksum(e.pcm))
            db.execute(
                f"INSERT OR REPLACE INTO entries ({_COLUMNS}, last_access) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*row, e.created, e.expires, op.last_access),
            )
            db.execute("DELETE FROM variants WHERE key=?", (e.key,))  # a new PCM: none yet
        elif isinstance(op, PutVariant):
            db.execute(
                "INSERT OR REPLACE INTO variants VALUES (?, ?, ?, ?, ?)",
                (op.key, op.name, op.data, checksum(op.data), op.pcm_checksum),
            )
        elif isinstance(op, Delete):
            db.executemany("DELETE FROM entries WHERE key=?", ((k,) for k in op.keys))
            db.executemany("DELETE FROM variants WHERE key=?", ((k,) for k in op.keys))
        elif isinstance(op, Touch):
            db.executemany(
                "UPDATE entries SET last_access=? WHERE key=?",
                ((at, key) for key, at in op.last_access.items()),
            )
        else:
            where, args = invalidate_where(op.voice, op.text_prefix)
            db.execute(f"DELETE FROM variants WHERE key IN (SELECT key FROM entries{where})", args)
            db.execute(f"DELETE FROM entries{where}", args)
            return True
        return False

    def count(self, voice: str | None = None, text_prefix: str | None = None) -> tuple[int, int]:
        """(rows, audio bytes) matching an invalidation filter (all rows without one)."""
        where, args = invalidate_where(voice, text_prefix)
        rows, nbytes = self.db.execute(
            f"SELECT count(*), coalesce(sum(nbytes), 0) FROM entries{where}", args
        ).fetchone()
        return int(rows), int(nbytes)

    def summary(self, now: float) -> dict[str, Any]:
        """What the file holds, for `voxserve cache stats --cache-dir` (reads only)."""
        rows, nbytes = self.count()
        expired = self.db.execute("SELECT count(*) FROM entries WHERE expires <= ?", (now,))
        voices = self.db.execute("SELECT voice, count(*) FROM entries GROUP BY voice ORDER BY 1")
        return {
            "path": str(self.path),
            "entries": rows,
            "bytes": nbytes,
            "expired": int(expired.fetchone()[0]),
            "by_voice": {voice: int(count) for voice, count in voices},
            "encoded_bytes": int(
                self.db.execute("SELECT coalesce(sum(length(data)), 0) FROM variants").fetchone()[0]
            ),
            "disk_bytes": self.file_bytes(),
        }

    def file_bytes(self) -> int:
        """The file and its WAL, as they take disk space now."""
        return sum(os.stat(p).st_size for p in _files(self.path) if os.path.exists(p))

    def reset(self) -> None:
        """Delete the file (and its WAL) and start an empty one."""
        self.close()
        for path in _files(self.path):
            Path(path).unlink(missing_ok=True)
        self._db = self._connect()

    def close(self) -> None:
        if self._db is not None:
            self._db.close()  # the last connection checkpoints the WAL into the file
            self._db = None


def invalidate_where(voice: str | None, text_prefix: str | None) -> tuple[str, tuple[str, ...]]:
    """The SQL filter for an invalidation; matches `matches()` on the in-memory side."""
    clauses: list[str] = []
    args: list[str] = []
    if voice is not None:
        clauses.append("voice = ?")
        args.append(voice)
    if text_prefix:
        clauses.append("substr(text_norm, 1, length(?)) = ?")
        args += [text_prefix, text_prefix]
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(args)


def matches(entry: Entry, voice: str | None, text_prefix: str | None) -> bool:
    return (voice is None or entry.voice == voice) and (
        not text_prefix or entry.text_norm.startswith(text_prefix)
    )


def _files(path: Path) -> Iterable[str]:
    return (str(path), f"{path}-wal", f"{path}-shm")

"""The one thread that writes the cache to disk, so the event loop never waits on sqlite.

The loop only queues ops; the thread runs them in order, a batch per transaction. The queue
is bounded by the audio bytes of pending puts (`max_pending_bytes`): past it, a new entry is
not written (it still serves from memory; counted in `dropped`), so a slow disk cannot grow
the backlog. Deletes and invalidations are never dropped: they are small, at most one per
entry ever put, and an invalidated reply must not come back after a restart. Last-access
times (LRU order after a restart) are coalesced per key and written every few seconds.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import deque

from voxserve.cache.entry import Entry
from voxserve.cache.store import Delete, Invalidate, Op, Put, PutVariant, SqliteStore, Touch

log = logging.getLogger(__name__)

BATCH_BYTES = 2 * 1024 * 1024  # audio per transaction: keeps the WAL (and a commit) small
TOUCH_INTERVAL_S = 5.0


class DiskWriter:
    def __init__(self, store: SqliteStore, max_pending_bytes: int) -> None:
        self.store = store
        self.max_pending_bytes = max_pending_bytes
        self._cond = threading.Condition()
        self._ops: deque[Op] = deque()
        self._touches: dict[str, float] = {}
        self._pending_bytes = 0
        self._queued = 0  # ops ever queued
        self._applied = 0  # ops ever run (or failed)
        self._touch_due = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self.written = 0
        self.dropped = 0
        self.errors = 0
        self._failing: str | None = None  # the cause of the failures going on, logged once

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="voxserve-cache-writer", daemon=True)
        self._thread.start()

    def put(self, entry: Entry, last_access: float) -> bool:
        with self._cond:
            if self._pending_bytes + entry.nbytes > self.max_pending_bytes:
                self.dropped += 1
                return False
            self._pending_bytes += entry.nbytes
            self._queue(Put(entry, last_access))
        return True

    def put_variant(self, op: PutVariant) -> bool:
        """An entry's encoding; bounded like `put` (an encoding not written is made again
        after a restart, nothing worse)."""
        with self._cond:
            if self._pending_bytes + len(op.data) > self.max_pending_bytes:
                self.dropped += 1
                return False
            self._pending_bytes += len(op.data)
            self._queue(op)
        return True

    def delete(self, keys: tuple[str, ...]) -> None:
        if keys:
            with self._cond:
                self._queue(Delete(keys))

    def invalidate(self, voice: str | None, text_prefix: str | None) -> None:
        with self._cond:
            self._queue(Invalidate(voice, text_prefix))

    def touch(self, key: str, at: float) -> None:
        with self._cond:
            self._touches[key] = at

    def _queue(self, op: Op) -> None:
        self._ops.append(op)
        self._queued += 1
        self._cond.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Block until everything queued so far (touches too) is on disk; False on timeout."""
        with self._cond:
            target = self._queued
            self._touch_due = True
            self._cond.notify_all()
            return self._cond.wait_for(
                lambda: self._applied >= target and not self._touch_due, timeout
            )

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        last_touch = time.monotonic()
        while True:
            with self._cond:
                self._cond.wait_for(self._has_work, TOUCH_INTERVAL_S)
                batch = self._take_batch()
                touches: dict[str, float] = {}
                due = time.monotonic() - last_touch >= TOUCH_INTERVAL_S
                if self._touches and (due or self._touch_due or self._closing) and not self._ops:
                    touches, self._touches = self._touches, {}
                    last_touch = time.monotonic()
                flushing_touches = self._touch_due and not self._ops
                stop = self._closing and not self._ops and not self._touches
            ops: list[Op] = [*batch, Touch(touches)] if touches else batch
            if ops:
                self._write(ops)
            with self._cond:
                self._applied += len(batch)
                self._pending_bytes -= sum(_weight(op) for op in batch)
                if flushing_touches:
                    self._touch_due = False
                self._cond.notify_all()
            if stop:
                return

    def _has_work(self) -> bool:
        return bool(self._ops) or self._closing or self._touch_due

    def _take_batch(self) -> list[Op]:
        batch: list[Op] = []
        size = 0
        while self._ops and (not batch or size < BATCH_BYTES):
            op = self._ops.popleft()
            size += _weight(op)
            batch.append(op)
        return batch

    def _write(self, ops: list[Op]) -> None:
        """One batch in one transaction. A full or failing disk: the batch is lost (the
        cache goes on in memory), counted in `errors`; the cause is logged once per run of
        failures (sqlite's code and message, never an entry's text), not per batch."""
        try:
            self.store.apply(ops)
        except sqlite3.Error as exc:
            self.errors += 1
            cause = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
            if cause != self._failing:
                self._failing = cause
                log.warning(
                    "tts cache writes fail; entries stay in memory only",
                    extra={"error": cause, "reason": str(exc), "ops": len(ops)},
                )
            return
        self.written += sum(1 for op in ops if isinstance(op, Put))
        if self._failing is not None:
            log.info("tts cache writes work again", extra={"failed": self.errors})
            self._failing = None


def _weight(op: Op) -> int:
    """The audio bytes an op writes: what the pending bound and a batch count."""
    if isinstance(op, Put):
        return op.entry.nbytes
    if isinstance(op, PutVariant):
        return len(op.data)
    return 0

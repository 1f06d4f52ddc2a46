"""The TTS cache the runtime owns: lookups, stores, expiry, invalidation, stats.

Every hit is served from memory (`ByteLru`); the disk (`SqliteStore`, written by the
`DiskWriter` thread) holds the same entries so a restart recovers them. Memory and disk are
bounded by the same `max_bytes`: an entry evicted or expired in memory is deleted on disk.
An entry also keeps the encodings of its PCM made for HTTP speech (`add_variant`,
`lookup_variant`): weighed in its bytes, evicted, expired and invalidated with it.
Times are wall-clock seconds (TTL survives a restart); the clock and the jitter's random
source are injectable so tests can move time.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from voxserve.cache.entry import Entry, checksum
from voxserve.cache.flight import Flights
from voxserve.cache.key import CacheKey, normalise_prefix
from voxserve.cache.lock import DirLock
from voxserve.cache.lru import ByteLru
from voxserve.cache.stats import CacheStats
from voxserve.cache.store import LoadReport, PutVariant, SqliteStore, matches
from voxserve.cache.writer import DiskWriter
from voxserve.config import CacheConfig

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 30.0
"""How often (at most, on a store or a stats call) every entry is checked for expiry; a
lookup checks its own entry every time, so an expired reply is never served."""


class TtsCache:
    def __init__(
        self,
        config: CacheConfig,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.path: Path = config.path()
        self.clock = clock
        self.rng = rng or random.Random()
        self.lru = ByteLru(config.max_bytes)
        self.flights = Flights()
        self.loaded = False
        self._store: SqliteStore | None = None
        self._writer: DiskWriter | None = None
        self._lock: DirLock | None = None
        self._report = LoadReport()
        # Invalidations made before the disk's entries were merged in apply to those too.
        self._early_filters: list[tuple[str | None, str | None]] = []
        self._next_sweep = 0.0
        self.hits = self.misses = self.coalesced = 0
        self.encoded_hits = self.encoded_stored = 0
        self.evictions = self.expirations = self.invalidated = self.not_cached = 0
        self.prewarm_total = self.prewarm_done = self.prewarm_failed = 0

    # -- start and stop --------------------------------------------------------------------

    async def load(self) -> LoadReport:
        """Open the disk cache and merge what it holds (in a thread: ~1 s per GB)."""
        if self.loaded:
            return self._report
        report = await asyncio.to_thread(self._open_and_read)
        self._merge(report)
        if self._writer is not None:
            self._writer.start()
        self.loaded = True
        log.info(
            "tts cache loaded",
            extra={
                "entries": len(report.entries),
                "bytes": report.loaded_bytes,
                "seconds": round(report.seconds, 3),
                "persistent": self._writer is not None,
            },
        )
        return report

    def _open_and_read(self) -> LoadReport:
        lock = DirLock(self.path.parent)
        try:
            if not lock.acquire():
                log.warning(
                    "tts cache directory is used by another process; this cache is memory-only",
                    extra={"path": str(self.path)},
                )
                return LoadReport()
            store = SqliteStore(self.path)
            report = store.load(self.clock(), self.config.max_bytes)
        except (OSError, sqlite3.Error) as exc:  # unusable directory: serve, without disk
            lock.release()
            log.warning("tts cache directory unusable; memory-only", extra={"error": str(exc)})
            return LoadReport()
        self._lock, self._store = lock, store
        self._writer = DiskWriter(store, self.config.write_queue_bytes)
        self._report = report
        return report

    def _merge(self, report: LoadReport) -> None:
        """Disk entries go under what was cached since start-up (those are newer)."""
        dropped: list[str] = []
        for entry in reversed(report.entries):  # most recently used first
            if entry.key in self.lru:
                continue
            if any(matches(entry, voice, prefix) for voice, prefix in self._early_filters):
                continue  # already deleted on disk by the queued invalidation
            if not self.lru.add_oldest(entry):
                dropped.append(entry.key)
        self._early_filters.clear()
        if dropped and self._writer is not None:
            self._writer.delete(tuple(dropped))

    async def aclose(self) -> None:
        """Stop syntheses, write what is queued, release the directory."""
        await self.flights.aclose()
        if self._writer is not None:
            await asyncio.to_thread(self._writer.close)
        if self._store is not None:
            self._store.close()
        if self._lock is not None:
            self._lock.release()
        self._writer = self._store = self._lock = None

    def flush(self, timeout: float = 10.0) -> bool:
        """Block until queued disk writes are done (tests, benchmarks, admin)."""
        return self._writer.flush(timeout) if self._writer is not None else True

    # -- the hot path ----------------------------------------------------------------------

    def lookup(self, key: CacheKey) -> Entry | None:
        """The live entry for `key`, counted as a hit; None (not counted) otherwise."""
        live = self._live(key.digest)
        if live is None:
            return None
        entry, now = live
        self._hit(entry, now)
        return entry

    def lookup_variant(self, key: CacheKey, name: str) -> tuple[Entry, bytes] | None:
        """The live entry of `key` and its encoding `name`, counted as a hit (an encoded
        one); None, not counted, when either is missing (the PCM path then looks again)."""
        live = self._live(key.digest)
        if live is None:
            return None
        entry, now = live
        data = entry.variants.get(name)
        if data is None:
            return None
        self.encoded_hits += 1
        self._hit(entry, now)
        return entry, data

    def _live(self, digest: str) -> tuple[Entry, float] | None:
        """The entry under `digest` and the time it was found live; None when there is
        none, or it had expired (then dropped and counted): both lookups judge alike."""
        entry = self.lru.get(digest)
        if entry is None:
            return None
        now = self.clock()
        if entry.expires <= now:
            self._drop([entry])
            self.expirations += 1
            return None
        return entry, now

    def _hit(self, entry: Entry, now: float) -> None:
        """Count a hit and tell the disk store the entry was used at `now`."""
        self.hits += 1
        if self._writer is not None:
            self._writer.touch(entry.key, now)

    def add_variant(self, digest: str, name: str, data: bytes, pcm_bytes: int) -> bool:
        """Keep `data`, the encoding `name` of the `pcm_bytes` of PCM cached under `digest`,
        beside that PCM. Not kept (False) when the entry is gone, holds other audio (it was
        replaced meanwhile), has that variant, or would outgrow max_entry_bytes."""
        entry = self.lru.peek(digest)
        if entry is None or len(entry.pcm) != pcm_bytes or name in entry.variants or not data:
            return False
        if entry.nbytes + len(data) > min(self.config.max_entry_bytes, self.config.max_bytes):
            return False
        evicted = self.lru.put(entry.with_variant(name, data))
        self.evictions += len(evicted)
        self.encoded_stored += 1
        if self._writer is not None:
            self._writer.delete(tuple(e.key for e in evicted))  # first: disk stays in bounds
            self._writer.put_variant(PutVariant(digest, name, data, checksum(entry.pcm)))
        return True

    def store(self, key: CacheKey, pcm: bytes) -> Entry | None:
        """Cache a complete reply, with its TTL jittered so entries made together do not all
        expire together; None if it is empty or too big to keep."""
        if not pcm or len(pcm) > min(self.config.max_entry_bytes, self.config.max_bytes):
            self.not_cached += 1
            return None
        now = self.clock()
        jitter = self.config.jitter
        ttl = self.config.ttl_s * (1.0 + self.rng.uniform(-jitter, jitter))
        entry = Entry(key.digest, key.voice, key.text_norm, key.sample_rate, pcm, now, now + ttl)
        evicted = self.lru.put(entry)
        self.evictions += len(evicted)
        if self._writer is not None:
            self._writer.delete(tuple(e.key for e in evicted))  # first: disk stays in bounds
            self._writer.put(entry, now)
        if now >= self._next_sweep:
            self.sweep()
        return entry

    # -- maintenance -----------------------------------------------------------------------

    def sweep(self) -> int:
        """Drop every expired entry (memory and disk); returns how many."""
        now = self.clock()
        self._next_sweep = now + SWEEP_INTERVAL_S
        expired = self.lru.remove_if(lambda entry: entry.expires <= now)
        self._delete_on_disk(expired)
        self.expirations += len(expired)
        return len(expired)

    def invalidate(
        self, *, voice: str | None = None, text_prefix: str | None = None, everything: bool = False
    ) -> int:
        """Drop the entries of a voice, or whose normalised text starts with `text_prefix`
        (both: both must match), or every entry. Syntheses in progress that match are not
        cached when they finish. Returns how many entries were dropped from memory."""
        if not everything and voice is None and not text_prefix:
            raise ValueError("say what to invalidate: a voice, a text prefix, or everything")
        prefix = normalise_prefix(text_prefix) if text_prefix and not everything else None
        voice = None if everything else voice
        removed = self.lru.remove_if(lambda entry: matches(entry, voice, prefix))
        for flight in self.flights.in_progress():
            if everything or (
                (voice is None or flight.key.voice == voice)
                and (not prefix or flight.key.text_norm.startswith(prefix))
            ):
                flight.mark_uncacheable()
        if self._writer is not None:
            self._writer.invalidate(voice, prefix)
        if not self.loaded:
            self._early_filters.append((voice, prefix))
        self.invalidated += len(removed)
        return len(removed)

    def clear(self) -> int:
        return self.invalidate(everything=True)

    def _drop(self, entries: list[Entry]) -> None:
        for entry in entries:
            self.lru.pop(entry.key)
        self._delete_on_disk(entries)

    def _delete_on_disk(self, entries: list[Entry]) -> None:
        if entries and self._writer is not None:
            self._writer.delete(tuple(entry.key for entry in entries))

    # -- reporting -------------------------------------------------------------------------

    def stats(self) -> CacheStats:
        if self.clock() >= self._next_sweep:
            self.sweep()
        lookups = self.hits + self.misses + self.coalesced
        writer = self._writer
        return CacheStats(
            entries=len(self.lru),
            bytes=self.lru.bytes,
            max_bytes=self.config.max_bytes,
            hits=self.hits,
            encoded_hits=self.encoded_hits,
            encoded_stored=self.encoded_stored,
            encoded_bytes=self.lru.encoded_bytes,
            misses=self.misses,
            coalesced=self.coalesced,
            hit_ratio=round(self.hits / lookups, 4) if lookups else 0.0,
            evictions=self.evictions,
            expirations=self.expirations,
            invalidated=self.invalidated,
            not_cached=self.not_cached,
            in_flight=len(self.flights),
            loaded=self.loaded,
            persistent=writer is not None,
            path=str(self.path),
            disk_bytes=self._store.file_bytes() if self._store is not None else 0,
            disk_written=writer.written if writer else 0,
            disk_dropped=writer.dropped if writer else 0,
            disk_errors=writer.errors if writer else 0,
            load_seconds=round(self._report.seconds, 3),
            loaded_entries=len(self._report.entries),
            corrupt_dropped=self._report.corrupt,
            prewarm_total=self.prewarm_total,
            prewarm_done=self.prewarm_done,
            prewarm_failed=self.prewarm_failed,
        )

"""Cached replies in memory, least recently used first, bounded by audio bytes (not count:
one long reply weighs what forty short ones do). Pure structure: expiry policy, counters and
the disk are the cache's (tts_cache.py)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from voxserve.cache.entry import Entry


class ByteLru:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.encoded_bytes = 0  # the part of `bytes` that is entries' encoded variants
        self._entries: OrderedDict[str, Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str) -> Entry | None:
        """The entry, now the most recently used; None if absent."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def peek(self, key: str) -> Entry | None:
        """The entry, its place in the order unchanged; None if absent."""
        return self._entries.get(key)

    def put(self, entry: Entry) -> list[Entry]:
        """Insert (or replace) as most recently used; returns what was evicted to fit, least
        recently used first. An entry larger than the whole bound is not kept."""
        self.pop(entry.key)
        if entry.nbytes > self.max_bytes:
            return []
        evicted: list[Entry] = []
        while self._entries and self.bytes + entry.nbytes > self.max_bytes:
            evicted.append(self._remove(next(iter(self._entries))))
        self._add(entry)
        return evicted

    def add_oldest(self, entry: Entry) -> bool:
        """Insert as least recently used if it fits (loading from disk under newer entries)."""
        if entry.key in self._entries or self.bytes + entry.nbytes > self.max_bytes:
            return False
        self._add(entry)
        self._entries.move_to_end(entry.key, last=False)
        return True

    def pop(self, key: str) -> Entry | None:
        return self._remove(key) if key in self._entries else None

    def _add(self, entry: Entry) -> None:
        self._entries[entry.key] = entry
        self.bytes += entry.nbytes
        self.encoded_bytes += entry.nbytes - len(entry.pcm)

    def _remove(self, key: str) -> Entry:
        entry = self._entries.pop(key)
        self.bytes -= entry.nbytes
        self.encoded_bytes -= entry.nbytes - len(entry.pcm)
        return entry

    def remove_if(self, predicate: Callable[[Entry], bool]) -> list[Entry]:
        """Remove and return every entry the predicate accepts."""
        removed = [entry for entry in self._entries.values() if predicate(entry)]
        for entry in removed:
            self.pop(entry.key)
        return removed

    def keys(self) -> list[str]:
        """Least recently used first."""
        return list(self._entries)

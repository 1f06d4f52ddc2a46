"""What the cache reports: GET /admin/cache, `voxserve cache stats`, the metrics."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class CacheStats:
    entries: int
    bytes: int  # PCM and encodings
    max_bytes: int
    hits: int  # encoded hits included
    encoded_hits: int  # hits served an encoding kept beside the PCM (mp3, opus, ...)
    encoded_stored: int  # encodings kept beside their PCM
    encoded_bytes: int  # bytes of those held now (part of `bytes`)
    misses: int
    coalesced: int  # requests that joined a synthesis already in progress
    hit_ratio: float  # hits / lookups
    evictions: int
    expirations: int
    invalidated: int
    not_cached: int  # replies not stored: over max_entry_bytes, empty, invalidated meanwhile
    in_flight: int
    loaded: bool
    persistent: bool
    path: str
    disk_bytes: int
    disk_written: int
    disk_dropped: int
    disk_errors: int
    load_seconds: float
    loaded_entries: int
    corrupt_dropped: int
    prewarm_total: int
    prewarm_done: int
    prewarm_failed: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

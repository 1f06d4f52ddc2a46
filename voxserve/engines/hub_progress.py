"""What a model fetch has done so far, for `/readyz` and the console.

`PROGRESS` is one process-wide registry of the fetches in flight (engines/hub.py adds one per
`fetch_repo` and drops it when done). `/readyz` reads it while the engines load, so a client
waiting on a first start sees bytes grow instead of a bare 503. The console shows
huggingface_hub's own tqdm bars (on stderr, only when it is a terminal: tqdm decides); the
bar class here counts the bytes of the one bar that sums every file's download into the
registry as well. This module imports no huggingface_hub, so the server can read the
registry without loading it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The bar snapshot_download feeds with every file's bytes (its "reconstruct" bar).
BYTES_BAR = "huggingface_hub.snapshot_download"


@dataclass(frozen=True, slots=True)
class Progress:
    """One fetch in flight: what /readyz and the console show."""

    name: str
    repo_id: str
    done_bytes: int
    total_bytes: int

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "done_bytes": self.done_bytes, "total_bytes": self.total_bytes}


class LoadProgress:
    """The fetches in flight in this process; thread-safe (fetches run in loader threads,
    /readyz reads on the event loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._items: dict[int, Progress] = {}

    def start(self, name: str, repo_id: str, done_bytes: int, total_bytes: int) -> int:
        with self._lock:
            token = next(self._ids)
            self._items[token] = Progress(name, repo_id, done_bytes, total_bytes)
            return token

    def set(self, token: int, done_bytes: int, total_bytes: int | None = None) -> Progress | None:
        with self._lock:
            item = self._items.get(token)
            if item is None:
                return None
            total = item.total_bytes if total_bytes is None else total_bytes
            item = Progress(item.name, item.repo_id, done_bytes, max(total, done_bytes))
            self._items[token] = item
            return item

    def finish(self, token: int) -> None:
        with self._lock:
            self._items.pop(token, None)

    def snapshot(self) -> list[Progress]:
        with self._lock:
            return list(self._items.values())


PROGRESS = LoadProgress()


def bar_class(on_bytes: Callable[[int], None]) -> type[Any]:
    """A huggingface_hub tqdm class that also hands the bytes of snapshot_download's byte bar
    to `on_bytes` (the running total). Its own display is huggingface_hub's: a bar on a
    terminal, nothing when stderr is not one or HF_HUB_DISABLE_PROGRESS_BARS is set. A
    disabled tqdm ignores update(), hence the count kept here."""
    from huggingface_hub.utils.tqdm import tqdm as hf_tqdm

    lock = threading.Lock()  # snapshot_download's threads (one per file) update one bar

    class _CountingBar(hf_tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._counts = kwargs.get("name") == BYTES_BAR
            self._seen = 0
            # None: tqdm shows a bar only on a terminal; the files bar of hf_thread_map
            # would otherwise write into a server's log lines
            kwargs.setdefault("disable", None)
            super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

        def update(self, n: float | None = 1) -> bool | None:
            if self._counts and n:
                with lock:  # counted and reported in order: /readyz never goes back
                    self._seen += int(n)
                    on_bytes(self._seen)
            result: bool | None = super().update(n)
            return result

    return _CountingBar

"""One writer per cache directory: a server holds an exclusive lock on it while it runs.

Two servers writing one directory would each bound only their own share of it (the disk
limit would not hold), and each would keep serving what the other invalidated. So the
second server runs with a memory-only cache, and offline `voxserve cache` commands that
write refuse a directory a server holds.
"""

from __future__ import annotations

import os
from pathlib import Path

from voxserve.private_files import open_private

try:
    import fcntl
except ImportError:  # not POSIX: no locking (documented as unsupported)
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = "tts-cache.lock"


class DirLock:
    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock without waiting; False when another process (or store) has it."""
        if self._fd is not None:
            return True
        fd = open_private(self.path)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

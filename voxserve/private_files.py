"""Every directory voxserve creates is 0700 and every file 0600, whatever the umask.

The cache holds every key's spoken text and audio, the client-secret store holds session
instructions, voice prompts are someone's recording: none of it is for other local users.
A mode given to mkdir/open is masked by the umask (it can only lose bits), so the mode is
set again explicitly after creation. Files that already exist (from an older version) are
tightened when voxserve opens them; directories that already exist are left as they are
(the operator may have chosen them), the files inside are private either way.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
SQLITE_SIDES = ("-wal", "-shm", "-journal")  # sqlite's own files beside a database


def private_dir(path: Path) -> Path:
    """`path` and any missing parent, created 0700; returns `path`. Raises OSError when it
    cannot be created (read-only, a file in the way)."""
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIR_MODE)
        except FileExistsError:  # another process made it meanwhile: its mode is its own
            continue
        os.chmod(directory, DIR_MODE)
    if not path.is_dir():
        raise NotADirectoryError(20, "Not a directory", str(path))
    return path


def tighten(path: Path) -> None:
    """Make an existing file of ours 0600 (a file another user owns is left alone)."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        if _loose(path.stat()):
            os.chmod(path, FILE_MODE)


def _loose(info: os.stat_result) -> bool:
    """A file of ours whose mode is not FILE_MODE (another user's is left alone)."""
    return info.st_uid == os.getuid() and info.st_mode & 0o777 != FILE_MODE


def open_private(path: Path, flags: int = os.O_RDWR) -> int:
    """A descriptor on `path`, created 0600 (its directory 0700) if it is not there."""
    private_dir(path.parent)
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        if _loose(os.fstat(fd)):
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_sqlite(path: Path) -> Path:
    """Ready `path` for sqlite3.connect: directory 0700, the database file made 0600 before
    sqlite creates it (sqlite gives its -wal and -shm the database file's mode), the side
    files of an older version tightened. Returns `path`."""
    os.close(open_private(path))
    for side in SQLITE_SIDES:
        tighten(path.with_name(path.name + side))
    return path

"""docs/architecture.md names only modules that exist: every `*.py` (or `dir/`) it mentions
is a file of voxserve/ or of the repository, so a move that forgets the page fails here.

A name with a slash must be the end of a real path (`server/ws/stream.py`, or a shorter
`websocket/link.py`); a bare name must exist somewhere in the package, and in a module
table row the bare names after the first path are that path's neighbours
(`server/grpc/server.py`, `service.py`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
_PATH = re.compile(
    r"(?<![\w/.-])\w[\w./-]*\.py\b"  # a module: name.py, dir/name.py
    r"|(?<![\w/.-])\w[\w.-]*(?:/[\w.-]+)*/(?=[`\s,)])"  # a package: dir/, dir/sub/
)


def _tree() -> list[str]:
    """The repository's files and folders, without hidden folders (.git, .venv, caches) and
    __pycache__: the virtualenv alone is ~100,000 files, which made this test take ~10 s."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d != "__pycache__"]
        here = Path(folder).relative_to(ROOT)
        found += [(here / name).as_posix() for name in subfolders + files]
    return found


def _known() -> tuple[set[str], set[str]]:
    files = _tree()
    names = {Path(f).name for f in files} | {Path(f).name + "/" for f in files}
    return set(files) | {f + "/" for f in files}, names


def missing_paths(text: str) -> list[str]:
    paths, names = _known()
    missing = []
    for number, line in enumerate(text.splitlines(), 1):
        first = line.split(" | ")[0] if line.startswith("| `") else ""
        base: str | None = None
        for token in _PATH.findall(line):
            if "/" in token.rstrip("/"):
                found = [p for p in paths if p == token or p.endswith("/" + token)]
                if token in first and found:
                    base = found[0].rsplit("/", 1)[0]
                ok = bool(found)
            elif base is not None and token in first:
                ok = f"{base}/{token}" in paths
            else:
                ok = token in names
            if not ok:
                missing.append(f"line {number}: {token}")
    return missing


def test_every_module_the_page_names_exists() -> None:
    assert missing_paths(PAGE.read_text()) == []


def test_a_moved_module_is_caught() -> None:
    page = "| `server/grpc/server.py`, `grpc_service.py` | the servicer |\nsee ws_link.py\n"
    assert missing_paths(page) == ["line 1: grpc_service.py", "line 2: ws_link.py"]

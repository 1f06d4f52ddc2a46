"""Fetch a model repository by name from the Hugging Face Hub, once, verified.

huggingface_hub's own client does the transfer: its cache (`HF_HOME`, `HF_HUB_CACHE`), its
endpoint (`HF_ENDPOINT`: a mirror, or the tests' stand-in), its per-file lock (two processes
pulling the same repo download each file once; the other waits and reuses it), its atomic
renames and its resume of a transfer cut mid-file (a Range request). What it checks is a
file's size; what it does not is the content, so each file is hashed here after download
against the Hub's metadata (`model_info(files_metadata=True)`: SHA-256 of LFS files, the git
blob id of the rest) and a file that fails is deleted and fetched once more; failing again is
`FetchFailed`. A verified file leaves a marker, so later loads check sizes only.

A repo whose wanted files are all in the cache and verified is used without any request
(`cached_path`): a restart neither waits on nor needs the network. Offline (`serve
--offline`, VOXSERVE_OFFLINE=1 or HF_HUB_OFFLINE=1) nothing else is tried and a missing
model is `ModelMissing`, whose one line names the command that fetches it.

Voxserve's own notes live in the repo's cache folder under `.voxserve/`: per commit the
wanted files' sizes and digests and the model card's licence (`<commit>.json`), and one
empty marker per verified digest (`verified/`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from voxserve.engines.hub_progress import PROGRESS, LoadProgress, Progress, bar_class

__all__ = [
    "PROGRESS",
    "FetchFailed",
    "LoadProgress",
    "ModelMissing",
    "Progress",
    "cached_licence",
    "cached_path",
    "fetch_repo",
    "hub_cache_dir",
    "hub_endpoint",
    "hub_offline",
    "pull_command",
    "remove_repo",
    "set_offline",
]

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
NOTES = ".voxserve"  # voxserve's notes inside a repo's cache folder
_TRUE = {"1", "on", "yes", "true"}


class ModelMissing(LookupError):
    """Offline and not in the cache. str() is one line naming the model and the command that
    fetches it: "model 'small.en' is not downloaded; run: voxserve models pull small.en"."""

    def __init__(self, name: str, damaged: Sequence[str] = ()) -> None:
        what = (
            f"is damaged in the cache ({', '.join(damaged)} fails its checksum)"
            if damaged
            else "is not downloaded"
        )
        super().__init__(f"model {name!r} {what}; run: {pull_command(name)}")
        self.name = name


class FetchFailed(RuntimeError):
    """The Hub could not give the model: unreachable, no such repo, a file that fails its
    checksum twice. str() is one line."""


def pull_command(name: str) -> str:
    return f"voxserve models pull {name}"


def hub_offline(settings_offline: bool = False) -> bool:
    """No network for models: the settings' flag, VOXSERVE_OFFLINE or HF_HUB_OFFLINE
    (read now, not at import: `serve --offline` sets it after huggingface_hub loaded)."""
    return settings_offline or any(
        os.environ.get(var, "").strip().lower() in _TRUE
        for var in ("VOXSERVE_OFFLINE", "HF_HUB_OFFLINE")
    )


def set_offline(offline: bool) -> None:
    """`serve --offline` (settings.offline): every engine of this process and of the
    workers it forks sees it through the environment, as huggingface_hub does."""
    if offline:
        os.environ["VOXSERVE_OFFLINE"] = "1"


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_cache_dir() -> Path:
    """huggingface_hub's cache folder, from the environment as it is now (its own constants
    are read once at import)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    home = os.environ.get("HF_HOME")
    if not home:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        home = os.path.join(xdg, "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def repo_folder(repo_id: str) -> Path:
    return hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))


def cached_path(
    repo_id: str,
    *,
    allow_patterns: Sequence[str] | None = None,
    revision: str | None = None,
) -> Path | None:
    """The snapshot dir if every wanted file is already in the cache (and verified: a file
    not yet verified is hashed now), else None. Never touches the network."""
    found = _cached(repo_id, allow_patterns, revision or DEFAULT_REVISION)
    return found[0] if found is not None and not found[1] else None


def cached_licence(repo_id: str, revision: str | None = None) -> str | None:
    """The licence the repo's model card gave when it was fetched (None: not fetched, or
    the card names none)."""
    storage = repo_folder(repo_id)
    commit = _commit_of(storage, revision or DEFAULT_REVISION)
    manifest = _read_manifest(storage, commit) if commit else None
    licence = manifest.get("license") if manifest else None
    return str(licence) if licence else None


def fetch_repo(
    repo_id: str,
    *,
    name: str,
    allow_patterns: Sequence[str] | None = None,
    revision: str | None = None,
    offline: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
    refresh: bool = False,
) -> Path:
    """The local snapshot directory of `repo_id` (downloaded on first use, verified,
    resumable; reused after). Safe when two processes fetch the same repo at once.
    `name` is what the user wrote (for messages and /readyz). `refresh`: ask the Hub for
    the revision's newest commit even when a copy is cached (a catalogue that grows, such
    as the Piper voices'); offline, the cached copy."""
    rev = revision or DEFAULT_REVISION
    offline = hub_offline(offline)
    found = _cached(repo_id, allow_patterns, rev)
    if found is not None and not found[1] and not (refresh and not offline):
        return found[0]
    if offline:
        raise ModelMissing(name, found[1] if found is not None else ())
    if found is not None:  # present but damaged: fetched again below
        storage = repo_folder(repo_id)
        commit = found[0].name
        manifest = _read_manifest(storage, commit) or {}
        _discard(storage, found[0], found[1], manifest.get("files", {}))
    return _download(repo_id, name, allow_patterns, rev, on_progress)


def remove_repo(repo_id: str) -> int:
    """Delete the repo's cache folder (every revision); the bytes freed, 0 if absent."""
    storage = repo_folder(repo_id)
    if not storage.is_dir():
        return 0
    freed = sum(p.stat().st_size for p in storage.rglob("*") if p.is_file() and not p.is_symlink())
    shutil.rmtree(storage, ignore_errors=True)
    lock_dir = hub_cache_dir() / ".locks" / storage.name
    shutil.rmtree(lock_dir, ignore_errors=True)
    return freed


# -- download -----------------------------------------------------------------------------


def _download(
    repo_id: str,
    name: str,
    allow_patterns: Sequence[str] | None,
    revision: str,
    on_progress: Callable[[Progress], None] | None,
) -> Path:
    from huggingface_hub import HfApi, snapshot_download

    endpoint = hub_endpoint()
    storage = repo_folder(repo_id)
    patterns = list(allow_patterns) if allow_patterns is not None else None
    try:
        info = HfApi(endpoint=endpoint, library_name="voxserve").model_info(
            repo_id, revision=revision, files_metadata=True
        )
    except Exception as exc:  # every Hub error is one line for the CLI
        raise FetchFailed(_why(name, repo_id, endpoint, exc)) from None
    commit = str(info.sha)
    files = _wanted(_manifest_files(info), patterns)
    _write_manifest(storage, commit, repo_id, _card_licence(info), files)
    _write_ref(storage, revision, commit)
    total = sum(int(f["size"]) for f in files.values())
    bad: list[str] = []
    for attempt in (1, 2):
        snapshot = storage / "snapshots" / commit
        present = sum(int(f["size"]) for p, f in files.items() if (snapshot / p).is_file())
        token = PROGRESS.start(name, repo_id, present, total)

        def counted(seen: int, token: int = token, present: int = present) -> None:
            item = PROGRESS.set(token, present + seen)
            if item is not None and on_progress is not None:
                on_progress(item)

        try:
            folder = snapshot_download(
                repo_id,
                revision=commit,
                cache_dir=str(hub_cache_dir()),
                allow_patterns=patterns,
                endpoint=endpoint,
                library_name="voxserve",
                tqdm_class=bar_class(counted),
            )
        except Exception as exc:
            if attempt == 1 and _short_transfer(exc):
                continue
            raise FetchFailed(_why(name, repo_id, endpoint, exc)) from None
        finally:
            PROGRESS.finish(token)
        snapshot = Path(str(folder))
        bad = _verify(storage, snapshot, files)
        if not bad:
            return snapshot
        _discard(storage, snapshot, bad, files)
    raise FetchFailed(
        f"model {name!r}: {', '.join(bad)} of {repo_id} failed its checksum twice "
        f"(downloaded from {endpoint}); try again later or check HF_ENDPOINT"
    )


def _short_transfer(exc: BaseException) -> bool:
    """A file huggingface_hub refused for its size (a short or cut body): worth once more.
    Its HTTP errors and "not in the cache" are OSErrors too, and are not."""
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    return isinstance(exc, OSError) and not isinstance(
        exc, (HfHubHTTPError, LocalEntryNotFoundError)
    )


def _why(name: str, repo_id: str, endpoint: str, exc: BaseException) -> str:
    """One line for a failed fetch, by the kind of failure."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"model {name!r} ({repo_id})"
    if isinstance(exc, GatedRepoError):
        return f"{where} is gated: accept its terms on the Hub and set HF_TOKEN"
    if isinstance(exc, RevisionNotFoundError):
        return f"{where}: no such revision at {endpoint}"
    if isinstance(exc, RepositoryNotFoundError):
        return f"{where}: no such model repository at {endpoint} (or it is private: set HF_TOKEN)"
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        return f"{where}: the Hub at {endpoint} answered HTTP {status}"
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return (
        f"{where} cannot be downloaded from {endpoint} ({reason}); fetch it where the Hub "
        f"is reachable ({pull_command(name)}) or set HF_ENDPOINT to a mirror"
    )


def _card_licence(info: Any) -> str | None:
    card = getattr(info, "card_data", None)
    licence = card.get("license") if card is not None else None
    if isinstance(licence, list):
        licence = ", ".join(str(x) for x in licence)
    return str(licence) if licence else None


def _manifest_files(info: Any) -> dict[str, dict[str, Any]]:
    """path -> {size, sha256 | git_sha1} from the model info's siblings."""
    files: dict[str, dict[str, Any]] = {}
    for sibling in info.siblings or ():
        entry: dict[str, Any] = {"size": sibling.size}
        if sibling.lfs is not None:
            entry["size"] = sibling.lfs.size
            entry["sha256"] = sibling.lfs.sha256
        elif sibling.blob_id:
            entry["git_sha1"] = sibling.blob_id
        if entry["size"] is None:
            entry["size"] = 0
        files[sibling.rfilename] = entry
    return files


def _wanted(
    files: dict[str, dict[str, Any]], patterns: Sequence[str] | None
) -> dict[str, dict[str, Any]]:
    if patterns is None:
        return dict(files)
    # huggingface_hub's filter_repo_objects: fnmatch, a pattern ending in "/" is a folder
    globs = [p + "*" if p.endswith("/") else p for p in patterns]
    return {
        path: entry
        for path, entry in files.items()
        if any(fnmatch.fnmatch(path, glob) for glob in globs)
    }


# -- the cache as it is -------------------------------------------------------------------


def _cached(
    repo_id: str, allow_patterns: Sequence[str] | None, revision: str
) -> tuple[Path, list[str]] | None:
    """(snapshot, files failing their check) when every wanted file is present, else None."""
    storage = repo_folder(repo_id)
    commit = _commit_of(storage, revision)
    manifest = _read_manifest(storage, commit) if commit else None
    if commit is None or manifest is None:
        return None
    files = _wanted(manifest.get("files", {}), allow_patterns)
    snapshot = storage / "snapshots" / commit
    if not files or not all((snapshot / path).is_file() for path in files):
        return None
    return snapshot, _verify(storage, snapshot, files)


def _commit_of(storage: Path, revision: str) -> str | None:
    if len(revision) == 40 and all(c in "0123456789abcdef" for c in revision):
        return revision
    try:
        return (storage / "refs" / revision).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _verify(storage: Path, snapshot: Path, files: dict[str, dict[str, Any]]) -> list[str]:
    """The files that fail their size or digest; each one that passes is marked verified."""
    bad: list[str] = []
    marks = storage / NOTES / "verified"
    for path, entry in sorted(files.items()):
        local = snapshot / path
        try:
            size = local.stat().st_size
        except OSError:
            bad.append(path)
            continue
        if size != int(entry["size"]):
            bad.append(path)
            continue
        digest = entry.get("sha256") or entry.get("git_sha1")
        if not digest or (marks / str(digest)).is_file():
            continue
        actual = _sha256(local) if "sha256" in entry else _git_sha1(local, size)
        if actual != digest:
            bad.append(path)
            continue
        with contextlib.suppress(OSError):  # a read-only cache: hashed again next time
            marks.mkdir(parents=True, exist_ok=True)
            (marks / str(digest)).touch()
    return bad


def _discard(
    storage: Path, snapshot: Path, bad: Iterable[str], files: dict[str, dict[str, Any]]
) -> None:
    """Delete failed files (the snapshot's link and the blob), under huggingface_hub's lock
    for that blob so a process downloading it meanwhile is not cut off."""
    from huggingface_hub.utils import WeakFileLock  # type: ignore[attr-defined]

    locks = hub_cache_dir() / ".locks" / storage.name
    for path in bad:
        link = snapshot / path
        blob = Path(os.path.realpath(link))
        locks.mkdir(parents=True, exist_ok=True)
        with WeakFileLock(str(locks / f"{blob.name}.lock")):
            for victim in (link, blob):
                with contextlib.suppress(FileNotFoundError):
                    victim.unlink()
        digest = files[path].get("sha256") or files[path].get("git_sha1")
        if digest:
            with contextlib.suppress(FileNotFoundError):
                (storage / NOTES / "verified" / str(digest)).unlink()


def _sha256(path: Path) -> str:
    with path.open("rb") as src:
        return hashlib.file_digest(src, "sha256").hexdigest()


def _git_sha1(path: Path, size: int) -> str:
    """git's blob id: SHA-1 of "blob <size>\\0" and the content (the Hub's blobId)."""
    digest = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
    with path.open("rb") as src:
        return hashlib.file_digest(src, lambda: digest).hexdigest()


def _read_manifest(storage: Path, commit: str) -> dict[str, Any] | None:
    """Our notes for `commit`, else what huggingface_hub's own tree listing of it says (a
    cache filled by `hf download` or faster-whisper, say for an air-gapped host)."""
    try:
        data = json.loads((storage / NOTES / f"{commit}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return _tree_listing(storage, commit)
    return data if isinstance(data, dict) else None


def _tree_listing(storage: Path, commit: str) -> dict[str, Any] | None:
    """huggingface_hub's `trees/<commit>.json` (format_version 1: path -> size, blob_id,
    lfs_sha256) as our notes."""
    try:
        data = json.loads((storage / "trees" / f"{commit}.json").read_text(encoding="utf-8"))
        listed = data["files"] if data.get("format_version") == 1 else None
        files: dict[str, dict[str, Any]] = {}
        for path, entry in (listed or {}).items():
            if entry.get("lfs_sha256"):
                files[path] = {"size": entry["size"], "sha256": entry["lfs_sha256"]}
            else:
                files[path] = {"size": entry["size"], "git_sha1": entry["blob_id"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return {"files": files, "license": None} if files else None


def _write_manifest(
    storage: Path,
    commit: str,
    repo_id: str,
    licence: str | None,
    files: dict[str, dict[str, Any]],
) -> None:
    old = _read_manifest(storage, commit) or {}
    merged = {**old.get("files", {}), **files}  # another allow_patterns may have added some
    data = {"repo_id": repo_id, "commit": commit, "license": licence, "files": merged}
    _write_atomic(storage / NOTES / f"{commit}.json", json.dumps(data, indent=1))


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    if revision != commit:
        _write_atomic(storage / "refs" / revision, commit)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

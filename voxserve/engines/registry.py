"""Find engine classes through Python entry points, so a third party can add one.

A package registers e.g. ``[project.entry-points."voxserve.tts"] myvoice = "pkg.mod:MyTts"``;
the class is constructed with the options from the ``engines`` section of the config.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

ENGINE_KINDS = ("vad", "asr", "tts", "responder")


class EngineNotFound(LookupError):
    pass


class EngineConfigError(ValueError):
    """An engine's options cannot work: an unknown option, a bad value, a model that is not
    installed. The message names the engine, the bad key and the valid choices; `serve` and
    every command print it as one line and exit 2 (bad configuration), before listening."""

    def __init__(self, kind: str, name: str, message: str) -> None:
        super().__init__(f"{kind} engine {name!r}: {message}")
        self.kind = kind
        self.name = name


def _group(kind: str) -> dict[str, EntryPoint]:
    if kind not in ENGINE_KINDS:
        raise EngineNotFound(f"unknown engine kind {kind!r}; kinds are {', '.join(ENGINE_KINDS)}")
    return {ep.name: ep for ep in entry_points(group=f"voxserve.{kind}")}


def engine_names(kind: str) -> list[str]:
    """Registered names for one kind, installed or not (loading may still fail)."""
    return sorted(_group(kind))


def engine_class(kind: str, name: str) -> Any:
    """Import and return the class registered as `name` for `kind`."""
    group = _group(kind)
    if name not in group:
        known = ", ".join(sorted(group)) or "none"
        raise EngineNotFound(f"no {kind} engine named {name!r}; registered: {known}")
    return group[name].load()


def entry_point_of(kind: str, name: str) -> EntryPoint | None:
    return _group(kind).get(name)

"""Find engine classes through Python entry points, so a third party can add one.

A package registers e.g. ``[project.entry-points."voxserve.tts"] myvoice = "pkg.mod:MyTts"``;
the class is constructed with the options from the ``engines`` section of the config.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pydantic import TypeAdapter, ValidationError

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


_NAMED = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def option_names(cls: Any) -> list[str] | None:
    """The options an engine class's constructor takes (keyword names, in order); None when
    it takes any (``**kwargs``) or has no signature to read (a C type)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return [name for name, p in params.items() if p.kind in _NAMED]


def check_options(kind: str, name: str, cls: Any, options: Mapping[str, Any]) -> None:
    """Raise EngineConfigError for an option the constructor does not take, or one it needs
    that is not given, naming the valid ones. Reads only the signature (no model is loaded),
    so `serve` can say it before the port opens; without this, a misspelt option was a
    TypeError traceback in the log of a server that never became ready."""
    valid = option_names(cls)
    if valid is None:
        return
    unknown = sorted(key for key in options if key not in valid)
    if unknown:
        what = "option" if len(unknown) == 1 else "options"
        raise EngineConfigError(
            kind,
            name,
            f"unknown {what} {', '.join(repr(k) for k in unknown)}; "
            f"valid options: {', '.join(valid) or 'none'}",
        )
    params = inspect.signature(cls).parameters
    missing = [
        key
        for key in valid
        if params[key].default is inspect.Parameter.empty and key not in options
    ]
    if missing:
        raise EngineConfigError(
            kind, name, f"missing option {', '.join(repr(k) for k in missing)} (required)"
        )
    _check_types(kind, name, cls, options)


def _check_types(kind: str, name: str, cls: Any, options: Mapping[str, Any]) -> None:
    """An option whose value cannot be of its annotated type (`"model": 5`,
    `"beam_size": "x"`) is an EngineConfigError now: inside the constructor it was a
    TypeError that left `serve` up and never ready. Lax (pydantic's JSON-ish rules), so a
    TOML list for a Sequence passes; a class whose hints cannot be read is not checked."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # names only the class's own module can resolve
        return
    for key, value in options.items():
        hint = hints.get(key)
        if hint is None:
            continue
        try:
            TypeAdapter(hint).validate_python(value)
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"].lower()
            raise EngineConfigError(
                kind, name, f"option {key!r} = {value!r}: {reason} ({_type_name(hint)})"
            ) from None
        except Exception:  # a type pydantic cannot check: the class judges
            continue


def _type_name(hint: Any) -> str:
    text = getattr(hint, "__name__", None) if isinstance(hint, type) else None
    return text or str(hint).replace("typing.", "").replace("collections.abc.", "")


def construct(kind: str, name: str, options: Mapping[str, Any]) -> Any:
    """The engine `name` of `kind` built with `options`, once they are checked
    (`check_options`): what every place that builds an engine calls (engines/loaded.py,
    the Ray core tier), so a bad option reads the same everywhere."""
    return instantiate(kind, name, engine_class(kind, name), options)


def instantiate(kind: str, name: str, cls: Any, options: Mapping[str, Any]) -> Any:
    """`cls(**options)` once checked. A TypeError or ValueError from the constructor is a
    value it refused (`threads=0`, a window bucket out of range): an EngineConfigError, so
    `serve` stops with one line (exit 2) instead of staying up unready with a traceback."""
    check_options(kind, name, cls, options)
    try:
        return cls(**options)
    except EngineConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise EngineConfigError(kind, name, f"bad option value: {exc}") from exc

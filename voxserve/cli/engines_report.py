"""`voxserve engines`: every registered engine per kind with its package, version, licence
and what it imports; with --load, each engine constructed as the runtime would, then closed.

Listing always succeeds; --load is a check of the install, so it fails (exit 1) when a
configured engine does not load."""

from __future__ import annotations

import argparse
import json
import time
from importlib.metadata import Distribution
from typing import TYPE_CHECKING, Any

from voxserve.cli.errors import EXIT_FAILURE, EXIT_OK, import_hint
from voxserve.cli.licences import (
    dist_license,
    licence_notes,
    model_notes,
    model_rows,
    module_distributions,
    named_model_rows,
)
from voxserve.cli.settings import configure_cli_logging, load_cli_settings, selected_engines

if TYPE_CHECKING:
    from voxserve.config import Settings

KINDS = ("vad", "asr", "tts", "responder")

Report = dict[str, list[dict[str, Any]]]
"""Rows per engine kind, as printed by --json."""


def cmd_engines(args: argparse.Namespace) -> int:
    from voxserve.engines.registry import engine_names, entry_point_of

    settings = load_cli_settings(args)
    configure_cli_logging(args)
    selected = set(selected_engines(settings))
    options = _engine_options(settings)
    report: Report = {}
    failed_selected: list[str] = []
    for kind in KINDS:
        rows = report.setdefault(kind, [])
        for name in engine_names(kind):
            ep = entry_point_of(kind, name)
            if ep is None:
                continue
            row = _describe_entry_point(kind, name, ep)
            row["selected"] = (kind, name) in selected
            if row["selected"] and options.get((kind, name)):
                row["options"] = _shown_options(options[(kind, name)])
            row["models"] = model_rows(kind, name, options.get((kind, name), {}))
            if args.load and row["imports"]:
                row["loaded"] = _load_one(kind, name, options.get((kind, name), {}), settings)
            ok = row["imports"] and "error" not in row.get("loaded", {})
            if row["selected"] and not ok:
                failed_selected.append(f"{kind}.{name}")
            rows.append(row)
    report["wake"] = [_wake_row(settings, load=args.load)]
    if args.load and report["wake"][0]["selected"] and "error" in report["wake"][0]["loaded"]:
        failed_selected.append("wake.micro_wakeword")
    named = named_model_rows(settings)
    notes = licence_notes(report) + model_notes(report, named)
    if args.json:
        body = {
            "engines": report,
            "selected": {
                "vad": settings.engines.vad.name,
                "asr": settings.engines.asr.name,
                "tts": [spec.name for spec in settings.engines.tts],
                "responder": settings.engines.responder.name,
                "wake": "micro_wakeword" if settings.wake.enabled else None,
            },
            "named_models": named,
            "notes": notes,
        }
        print(json.dumps(body, indent=2, ensure_ascii=False))
    else:
        print(_engines_text(report, notes, named))
    # Listing always succeeds; --load is a check of the install, so it fails when a
    # configured engine does not load.
    return EXIT_FAILURE if args.load and failed_selected else EXIT_OK


def _engine_options(settings: Settings) -> dict[tuple[str, str], dict[str, Any]]:
    cfg = settings.engines
    found: dict[tuple[str, str], dict[str, Any]] = {
        ("vad", cfg.vad.name): dict(cfg.vad.options),
        ("asr", cfg.asr.name): dict(cfg.asr.options),
        ("responder", cfg.responder.name): dict(cfg.responder.options),
    }
    for spec in cfg.tts:
        found[("tts", spec.name)] = dict(spec.options)
    return found


_SECRET_WORDS = ("key", "secret", "token", "password")


def _shown_options(options: dict[str, Any]) -> dict[str, Any]:
    """The configured options of a selected engine (which `model`, `device`, remote), so
    the listing says what `serve` would load without loading it; secrets masked."""
    return {
        key: "***" if any(word in key.lower() for word in _SECRET_WORDS) else value
        for key, value in options.items()
    }


def _describe_entry_point(kind: str, name: str, ep: Any) -> dict[str, Any]:
    """Package, version and licence from metadata, and whether the class imports.

    No model is loaded: `uses` comes from reading the engine module's imports."""
    dist: Distribution | None = getattr(ep, "dist", None)
    row: dict[str, Any] = {
        "kind": kind,
        "name": name,
        "entry_point": ep.value,
        "package": dist.name if dist is not None else "unknown",
        "version": dist.version if dist is not None else "unknown",
        "license": dist_license(dist) if dist is not None else "unknown",
        "uses": module_distributions(ep.module, exclude=dist.name if dist else None),
    }
    try:
        ep.load()
    except Exception as exc:
        row["imports"] = False
        hint = f"; {import_hint(exc)}" if isinstance(exc, ImportError) else ""
        row["import_error"] = " ".join(f"{type(exc).__name__}: {exc}{hint}".split())
    else:
        row["imports"] = True
    return row


def _wake_row(settings: Settings, *, load: bool) -> dict[str, Any]:
    """The wake engine: not a registry kind (one built-in engine, `wake.*` settings), listed
    as the others are; selected when `wake.enabled`, loaded (its models) with --load."""
    from importlib.metadata import EntryPoint, distribution

    value = "voxserve.engines.micro_wakeword:MicroWakeWordEngine"
    ep = EntryPoint("micro_wakeword", value, "voxserve.wake")
    dist = distribution("voxserve")
    row = _describe_entry_point("wake", "micro_wakeword", _Located(ep, dist))
    row["selected"] = settings.wake.enabled
    if load and row["imports"] and settings.wake.enabled:
        from voxserve.engines.micro_wakeword import load_wake

        seconds: dict[str, float] = {}
        try:
            engine = load_wake(settings.wake, seconds)
        except Exception as exc:
            row["loaded"] = {"error": " ".join(f"{type(exc).__name__}: {exc}".split())}
            return row
        if engine is None:  # pymicro-wakeword not installed
            row["loaded"] = {"error": "pymicro-wakeword is not installed (the `wyoming` extra)"}
            return row
        info = engine.info
        row["loaded"] = {
            "seconds": round(seconds["wake"], 3),
            "package": info.package,
            "version": info.version,
            "license": info.license,
            "model": info.model,
        }
        engine.close()
    return row


class _Located:
    """An entry point with its distribution (what `_describe_entry_point` reads)."""

    def __init__(self, ep: Any, dist: Distribution) -> None:
        self.value, self.module, self.dist, self.load = ep.value, ep.module, dist, ep.load


def _load_one(kind: str, name: str, options: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Construct one engine as the runtime would, report what it says, then close it."""
    from voxserve.engines.base import close_engine
    from voxserve.engines.registry import engine_class

    options = dict(options)
    if kind != "responder":
        options.setdefault("threads", settings.engines.default_threads)
    started = time.perf_counter()
    try:
        engine = engine_class(kind, name)(**options)
    except Exception as exc:
        return {"error": " ".join(f"{type(exc).__name__}: {exc}".split())}
    seconds = time.perf_counter() - started
    try:
        info = engine.info
        loaded: dict[str, Any] = {
            "seconds": round(seconds, 3),
            "package": info.package,
            "version": info.version,
            "license": info.license,
            "model": info.model,
        }
        if kind == "tts":
            loaded["sample_rate"] = engine.sample_rate
            loaded["voices"] = [
                {
                    "id": v.id,
                    "language": v.language,
                    "sample_rate": v.sample_rate,
                    "description": v.description,
                }
                for v in engine.voices()
            ]
        if kind == "asr":
            loaded["languages"] = list(engine.languages)
        return loaded
    finally:
        close_engine(engine)


def _engines_text(report: Report, notes: list[str], named: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    for kind, rows in report.items():
        lines.append(f"{kind}:")
        if not rows:
            lines.append("  (none registered)")
        for row in rows:
            mark = "  [selected]" if row["selected"] else ""
            lines.append(
                f"  {row['name']:<8} {row['package']} {row['version']} ({row['license']})"
                f"  {row['entry_point']}{mark}"
            )
            if "options" in row:
                shown = ", ".join(f"{k}={v!r}" for k, v in row["options"].items())
                lines.append(f"           options: {shown}")
            if row["uses"]:
                uses = ", ".join(
                    f"{d['package']} {d['version']} ({d['license']})" for d in row["uses"]
                )
                lines.append(f"           uses: {uses}")
            if row.get("models"):
                lines.append(f"           models: {_models_text(row['models'])}")
            if row["imports"]:
                lines.append("           imports: ok")
            else:
                lines.append(f"           imports: NO - {row['import_error']}")
            loaded = row.get("loaded")
            if loaded is None:
                continue
            if "error" in loaded:
                lines.append(f"           load: FAILED - {loaded['error']}")
                continue
            model = f", model {loaded['model']}" if loaded["model"] else ""
            lines.append(
                f"           loaded in {loaded['seconds']:.2f} s: {loaded['package']} "
                f"{loaded['version']} ({loaded['license']}){model}"
            )
            if loaded.get("voices"):
                voices = ", ".join(f"{v['id']} ({v['language']})" for v in loaded["voices"])
                lines.append(f"           voices: {voices}")
            if loaded.get("languages"):
                lines.append(f"           languages: {', '.join(loaded['languages'])}")
    if named:
        lines.append("named models ([models.named]):")
        lines += [f"  {_models_text([row])}" for row in named]
    for note in notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _models_text(rows: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"{row['name']} ({row['licence']}{'; NON-COMMERCIAL' if row['non_commercial'] else ''})"
        for row in rows
    )

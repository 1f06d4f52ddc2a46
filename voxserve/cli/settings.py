"""What every command does first: settings (file < env < flags), quiet logging, and the
configured engines, imported early so a missing package is one clear line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from voxserve.cli.errors import CliError, import_hint

if TYPE_CHECKING:
    from voxserve.config import EngineSpec, Settings
    from voxserve.runtime import Runtime


def load_cli_settings(args: argparse.Namespace, **overrides: Any) -> Settings:
    """Settings for a command: defaults < config file < VOXSERVE_* env < flags."""
    from pydantic_settings import SettingsError

    from voxserve.config import ConfigError, load_settings
    from voxserve.observe.logs import parse_level

    try:
        settings = load_settings(getattr(args, "config", None), **overrides)
    except SettingsError as exc:  # e.g. a VOXSERVE_* nested value that is not valid JSON
        raise ConfigError(f"invalid environment setting: {exc}") from exc
    try:
        parse_level(settings.log_level)
    except ValueError as exc:
        raise ConfigError(f"invalid setting log_level: {exc}") from exc
    return settings


def configure_cli_logging(args: argparse.Namespace) -> None:
    """Quiet by default (stdout is the command's output); --verbose shows info logs."""
    from voxserve.observe.logs import configure_logging

    verbose = bool(getattr(args, "verbose", False))
    configure_logging("info" if verbose else "error", json_format=False)


def selected_engines(settings: Settings) -> list[tuple[str, str]]:
    return [(kind, spec.name) for kind, spec in selected_specs(settings)]


def selected_specs(settings: Settings) -> list[tuple[str, EngineSpec]]:
    cfg = settings.engines
    return [
        ("vad", cfg.vad),
        ("asr", cfg.asr),
        *(("tts", spec) for spec in cfg.tts),
        ("responder", cfg.responder),
    ]


def check_engines_import(settings: Settings, extra: Sequence[tuple[str, EngineSpec]] = ()) -> None:
    """Import the configured engines' classes and check their option names now, so a
    missing optional package, an unknown engine name (EngineNotFound) or a misspelt option
    (EngineConfigError) is one clear line (exit 2 for the last two) before the port opens,
    not a failure deep inside model loading. Option types are checked against the
    constructor's annotations too; other values are the constructors' to judge: they raise
    EngineConfigError (or ValueError) while loading, which ends `serve` the same way. `extra`:
    more engines to check (the Ray core tier's ASR engine per language)."""
    from voxserve.engines.registry import check_options, engine_class

    for kind, spec in [*selected_specs(settings), *extra]:
        try:
            cls = engine_class(kind, spec.name)
        except ImportError as exc:
            raise CliError(
                f"the {kind} engine {spec.name!r} cannot be imported ({exc}); {import_hint(exc)}"
            ) from exc
        check_options(kind, spec.name, cls, spec.options)


def load_runtime(settings: Settings) -> Runtime:
    """A runtime for one command (say, transcribe): no TTS cache, which lives with a
    server (one process per cache directory) and would cost more to load than it saves."""
    from voxserve.engines.loaded import load_engines
    from voxserve.runtime import Runtime

    settings = settings.model_copy(
        update={"cache": settings.cache.model_copy(update={"enabled": False})}
    )
    return Runtime.from_engines(settings, load_engines(settings))

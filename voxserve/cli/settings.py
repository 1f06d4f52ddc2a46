"""What every command does first: settings (file < env < flags), quiet logging, and the
configured engines, imported early so a missing package is one clear line."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from voxserve.cli.errors import CliError, import_hint

if TYPE_CHECKING:
    from voxserve.config import Settings
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
    cfg = settings.engines
    return [
        ("vad", cfg.vad.name),
        ("asr", cfg.asr.name),
        *(("tts", spec.name) for spec in cfg.tts),
        ("responder", cfg.responder.name),
    ]


def check_engines_import(settings: Settings) -> None:
    """Import the configured engines' classes now, so a missing optional package is one
    clear line before anything starts, not a failure deep inside model loading."""
    from voxserve.engines.registry import engine_class

    for kind, name in selected_engines(settings):
        try:
            engine_class(kind, name)
        except ImportError as exc:
            raise CliError(
                f"the {kind} engine {name!r} cannot be imported ({exc}); {import_hint(exc)}"
            ) from exc


def load_runtime(settings: Settings) -> Runtime:
    """A runtime for one command (say, transcribe): no TTS cache, which lives with a
    server (one process per cache directory) and would cost more to load than it saves."""
    from voxserve.engines.loaded import load_engines
    from voxserve.runtime import Runtime

    settings = settings.model_copy(
        update={"cache": settings.cache.model_copy(update={"enabled": False})}
    )
    return Runtime.from_engines(settings, load_engines(settings))

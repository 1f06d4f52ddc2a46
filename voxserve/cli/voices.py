"""`serve` with an OpenAI voice table (settings.tts.openai_voices): the TTS engines are built
before the server starts, so an entry naming a voice that is not installed is one line and
exit 2 (ConfigError) rather than a server answering `unknown_voice`; the engines built are
then the server's own (no second load)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from voxserve.config import Settings


def checked_voice_table(settings: Settings) -> dict[str, Any] | None:
    """The TTS engines ("tts.NAME", for `Runtime(preloaded=...)`) once the table is checked
    against their voices; None without a table (nothing is built early)."""
    table = settings.tts.openai_voices
    if not table:
        return None
    from voxserve.engines.base import close_engine, voices_of
    from voxserve.engines.loaded import build_engine
    from voxserve.server.session.openai_voices import check_table

    cfg = settings.engines
    built: dict[str, Any] = {}
    try:
        for spec in cfg.tts:
            built[f"tts.{spec.name}"], _ = build_engine("tts", spec, cfg.default_threads)
        check_table(table, voices_of(list(built.values())))
    except BaseException:
        for engine in built.values():
            close_engine(engine)
        raise
    return built


def close_built(built: dict[str, Any] | None) -> None:
    """Engines built for the check that the server will not use (`--workers N` builds its
    own before forking)."""
    from voxserve.engines.base import close_engine

    for engine in (built or {}).values():
        close_engine(engine)

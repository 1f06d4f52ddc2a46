"""OpenAI's model names, which mean the default engines so the official SDK works unchanged
(HTTP /v1 and gRPC list them beside the engines' own names), and GET /v1/models: every
name a request's `model` may give, configured models ([models]) included, loaded or not."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response

from voxserve.engines.loaded import Engines
from voxserve.pipeline.models.names import OPENAI_ASR_MODELS, OPENAI_TTS_MODELS, ModelEntry
from voxserve.pipeline.models.table import ModelTable
from voxserve.runtime import Runtime

__all__ = ["OPENAI_ASR_MODELS", "OPENAI_TTS_MODELS", "models_response"]


def models_response(runtime: Runtime) -> Response:
    """OpenAI's list shape (`client.models.list()`), a row per name: `engine_model` (the
    weights it runs on, e.g. Whisper `tiny.en`), `root` (the model the name is an alias
    of), `kind`, `licence`, `loaded` (a named model is loaded on first use)."""
    engines = runtime.engines
    models = runtime.models
    rows: dict[str, dict[str, Any]] = {}

    def add(name: str, root: str, kind: str, engine_model: str, licence: str, loaded: bool) -> None:
        rows.setdefault(
            name,
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "voxserve",
                "engine_model": engine_model,
                "root": root,
                "kind": kind,
                "licence": licence,
                "loaded": loaded,
            },
        )

    # Named models first: an entry may claim an OpenAI name (then it is what that name means).
    for entry in models.entries():
        if entry.default:
            continue
        engine = models.loaded_engine(entry)
        model = engine.info.model if engine is not None else entry.engine_model()
        licence = engine.info.license if engine is not None else _licence(entry)
        for name in (entry.name, *entry.aliases):
            add(name, entry.name, entry.kind, model, licence, engine is not None)
    _defaults(engines, models, add)
    return JSONResponse({"object": "list", "data": list(rows.values())})


def _defaults(engines: Engines, models: ModelTable, add: Any) -> None:
    """The default engines under every name that means them, as before [models] existed."""
    has_voices = bool(engines.voices())
    default_tts = engines.voice(None)[1] if has_voices else None
    tts = models.entry("tts", None)
    for name in (*OPENAI_TTS_MODELS, *tts.aliases):
        if default_tts is not None:
            info = default_tts.info
            add(name, tts.name, "tts", info.model, info.license, True)
    for engine in engines.tts:
        info = engine.info
        add(info.name, info.name, "tts", info.model, info.license, True)
    asr = models.entry("asr", None)
    info = engines.asr.info
    for name in (*OPENAI_ASR_MODELS, asr.name, *asr.aliases, "whisper"):
        add(name, asr.name, "asr", info.model, info.license, True)
    for entry in models.entries():  # entries configured as the default itself
        if entry.default and entry is not asr and entry is not tts:
            for name in (entry.name, *entry.aliases):
                add(name, asr.name, "asr", info.model, info.license, True)


def _licence(entry: ModelEntry) -> str:
    """A model not loaded yet: what the catalogue says of its name (no network)."""
    from voxserve.engines.model_catalog import catalogue_licence

    return catalogue_licence(entry.engine, entry.engine_model())

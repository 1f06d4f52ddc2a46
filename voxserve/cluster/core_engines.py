"""The real engines inside core replicas, built through the same registry as in-process.

A replica loads a model per multiplexed id (an ASR language, a TTS voice) on first use and
keeps `max_models_per_replica` of them (Ray Serve evicts the least recently used, calling
`__del__`, which closes the engine). What the tier serves (languages, voices, sample rates)
is read from the engines themselves, so the gateway advertises exactly what the core has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from voxserve.config import EnginesConfig, EngineSpec
from voxserve.engines.base import TtsEngine, close_engine, short_first_piece
from voxserve.engines.registry import construct
from voxserve.types import EngineInfo, Voice


def build_engine(kind: str, spec: EngineSpec, default_threads: int) -> Any:
    """Construct one engine as engines/loaded.py does (threads from the config unless set;
    options checked, an unknown one an EngineConfigError naming the valid ones)."""
    options = dict(spec.options)
    options.setdefault("threads", default_threads)
    return construct(kind, spec.name, options)


class Loaded:
    """A model held by the multiplexing cache; closed when Serve evicts it."""

    def __init__(self, model_id: str, engine: Any, on_unload: Any = None) -> None:
        self.model_id = model_id
        self.engine = engine
        self._on_unload = on_unload

    def __del__(self) -> None:
        if self._on_unload is not None:
            self._on_unload(self.model_id)
        close_engine(self.engine)


@dataclass(frozen=True)
class TtsEngineEntry:
    """One core TTS engine as the gateway sees it (its RemoteTts mirrors this)."""

    name: str
    info: EngineInfo
    sample_rate: int
    voices: tuple[Voice, ...]
    cache_fingerprint: str = ""
    short_first_piece: bool = False  # its synthesize takes short_first (engines/base.py)


@dataclass
class TtsCatalogue:
    """Which configured engine serves which voice; built once per replica."""

    engines: dict[str, TtsEngineEntry] = field(default_factory=dict)
    voice_spec: dict[str, EngineSpec] = field(default_factory=dict)  # id and aliases
    spare: dict[str, Any] = field(default_factory=dict)  # built while reading, reused once

    @classmethod
    def read(cls, config: EnginesConfig) -> TtsCatalogue:
        found = cls()
        for spec in config.tts:
            engine = build_engine("tts", spec, config.default_threads)
            voices = tuple(engine.voices())
            found.engines[spec.name] = TtsEngineEntry(
                spec.name,
                engine.info,
                int(engine.sample_rate),
                voices,
                str(getattr(engine, "cache_fingerprint", "")),
                short_first_piece(engine),
            )
            for voice in voices:
                for key in (voice.id, *voice.aliases):
                    found.voice_spec.setdefault(key, spec)
            found.spare[spec.name] = engine
        return found

    def engine_for(self, voice: str, default_threads: int) -> TtsEngine:
        spec = self.voice_spec.get(voice)
        if spec is None:
            raise ValueError(f"unknown voice {voice!r}; valid voices: {sorted(self.voice_spec)}")
        spare = self.spare.pop(spec.name, None)
        if spare is not None:
            return spare  # type: ignore[no-any-return]
        return build_engine("tts", spec, default_threads)  # type: ignore[no-any-return]

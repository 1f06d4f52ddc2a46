"""The cache-key fingerprint of each TTS engine, made once per engine object.

What of an engine goes into its voices' keys: its info, the options it was built with (the
config's spec of that name) and an optional `cache_fingerprint` string it declares. `reset`
after a reload: the new engines were built from the settings given then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from voxserve.cache.key import EngineFingerprint
from voxserve.config import EngineSpec
from voxserve.engines.base import TtsEngine


class EngineFingerprints:
    def __init__(self, specs: Sequence[EngineSpec]) -> None:
        """`specs`: the configured TTS engines (settings.engines.tts)."""
        self._specs = specs
        self._made: dict[int, EngineFingerprint] = {}  # id(engine): engines live as long

    def of(self, engine: TtsEngine) -> EngineFingerprint:
        found = self._made.get(id(engine))
        if found is None:
            options: dict[str, Any] = {}
            for spec in self._specs:
                if spec.name == engine.info.name:
                    options = spec.options
                    break
            extra = str(getattr(engine, "cache_fingerprint", ""))
            found = self._made[id(engine)] = EngineFingerprint.of(engine.info, options, extra)
        return found

    def reset(self, specs: Sequence[EngineSpec]) -> None:
        """Forget every fingerprint made (the engines were reloaded from `specs`)."""
        self._specs = specs
        self._made.clear()

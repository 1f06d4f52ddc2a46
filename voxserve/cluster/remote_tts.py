"""`RemoteTts`: the TtsEngine protocol over the core tier's TTS deployment (engine `ray`).

One RemoteTts mirrors one core TTS engine (`engine` option: its name in the core's
`engines.tts`): its voices, sample rate and info come from the core, so clients see exactly
what the core serves. Closing the chunk generator (barge-in, a client gone) cancels the
remote stream. A refusal before any audio raises TtsDegraded, so the speaker answers with
the fallback phrase as it does for a saturated local engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from voxserve.cluster.calls import TierClient
from voxserve.cluster.connect import TTS_DEPLOYMENT, deployment_handle, tts_app
from voxserve.cluster.core_engines import TtsEngineEntry
from voxserve.cluster.credits import tier_credits
from voxserve.cluster.gateway import gateway_config
from voxserve.engines.base import Int16Array
from voxserve.errors import VoxError
from voxserve.pipeline.scheduling.tts_health import TtsDegraded
from voxserve.types import EngineInfo, Voice

DESCRIBE_TIMEOUT_S = 120.0
MIN_SPEED = 0.25
MAX_SPEED = 4.0


class RemoteTts:
    def __init__(
        self,
        *,
        engine: str | None = None,
        cluster: dict[str, Any] | None = None,
        threads: int = 1,
    ) -> None:
        """`engine`: which core TTS engine this mirrors (None: the core's first)."""
        self.config = gateway_config(cluster)
        handle = deployment_handle(self.config, TTS_DEPLOYMENT, tts_app(self.config))
        self.client = TierClient(
            "tts",
            handle,
            tier_credits("tts", self.config.credits),
            retries=self.config.retries,
            on_refused=self._refused,
        )
        entries: list[TtsEngineEntry] = (
            handle.options(method_name="describe").remote().result(timeout_s=DESCRIBE_TIMEOUT_S)
        )
        entry = _pick(entries, engine)
        core = entry.info
        self.info = EngineInfo(
            "tts", "ray", core.package, core.version, core.license, f"{core.name}/{core.model}"
        )
        self.sample_rate = entry.sample_rate
        self.cache_fingerprint = entry.cache_fingerprint
        self.short_first_piece = entry.short_first_piece  # the core engine's choice, passed on
        self._voices: tuple[Voice, ...] = tuple(entry.voices)
        self._ids = {key: v.id for v in self._voices for key in (v.id, *v.aliases)}

    def _refused(self) -> VoxError:
        return TtsDegraded("queue", retry_after_s=1)

    def voices(self) -> tuple[Voice, ...]:
        return self._voices

    def synthesize(
        self, text: str, *, voice: str, speed: float = 1.0, short_first: bool = True
    ) -> Iterator[Int16Array]:
        """Checks at once (cheap, on the event loop); the remote call starts at the first
        `next`. `short_first` goes to the core's engine where it takes it (engines/base.py,
        short_first_piece), so a stream resumed on another replica is cut the same way."""
        voice_id = self._ids.get(voice)
        if voice_id is None:
            raise ValueError(f"unknown voice {voice!r}; valid voices: {sorted(self._ids)}")
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed {speed:g} is out of range {MIN_SPEED:g}-{MAX_SPEED:g}")
        return self.client.stream(
            "synthesize",
            voice_id,
            self.config.tts_chunk_timeout_s,
            text,
            voice_id,
            speed,
            short_first,
        )


def _pick(entries: list[TtsEngineEntry], engine: str | None) -> TtsEngineEntry:
    if not entries:
        raise ValueError("the cluster's TTS tier serves no engine")
    if engine is None:
        return entries[0]
    for entry in entries:
        if entry.name == engine:
            return entry
    names = ", ".join(e.name for e in entries)
    raise ValueError(f"the cluster's TTS tier has no engine {engine!r}; it has {names}")

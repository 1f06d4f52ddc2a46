"""Cross-session VAD batching: one executor call judges the audio of every stream that is due.

Handing work to a thread costs more than silero's ~120 µs per window (the bench measured a
2.8 ms mean stage latency for ~20 µs of work at 130 streams), so VAD requests go through a
`Batcher`, and an engine with `speech_probs_many` runs window k of every stream as one batched
model call. Per-stream order holds because a listener has one request in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from voxserve.audio.pcm import Float32Array
from voxserve.engines.base import VadEngine
from voxserve.pipeline.batcher import Batcher
from voxserve.pipeline.stage import EngineStage


def judge_many(vad: VadEngine, states: Sequence[Any], audios: Sequence[Float32Array]) -> list[Any]:
    """Blocking: the engine's batched path if it has one, else one stream after another."""
    many = getattr(vad, "speech_probs_many", None)
    if callable(many):
        return list(many(states, audios))
    return [vad.speech_probs(state, audio) for state, audio in zip(states, audios, strict=True)]


class VadBatcher(Batcher[tuple[Any, Float32Array], Float32Array]):
    def __init__(
        self, vad: VadEngine, stage: EngineStage, *, max_wait_ms: float, max_batch: int
    ) -> None:
        def run_many(items: list[tuple[Any, Float32Array]]) -> list[Float32Array]:
            results = judge_many(vad, [s for s, _ in items], [a for _, a in items])
            return [np.asarray(probs, dtype=np.float32) for probs in results]

        super().__init__("vad", stage, run_many, max_wait_ms=max_wait_ms, max_batch=max_batch)
        self.vad = vad

    async def speech_probs(self, state: Any, audio: Float32Array) -> Float32Array:
        return await self.submit((state, audio))

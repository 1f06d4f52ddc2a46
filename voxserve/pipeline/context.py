"""What the pipeline is given: narrow views of the process's parts, never the runtime.

`SpeechParts` is what making speech shares across the process beyond the stages (the cache,
fingerprints, TTS health, the fallback phrase, the memory guard, the executor). One-shot
work reads a protocol: recognition an `EngineContext`, synthesis a `SpeechContext`; the
runtime (server/, cli/) passes itself, a session its `SessionContext`. A `SessionContext`
is what one live session reads, made by the runtime for each session and bound to the
engine generation the session holds a lease on until it ends.
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol

from voxserve.audio.pool import BufferPool
from voxserve.cache.fingerprints import EngineFingerprints
from voxserve.cache.tts_cache import TtsCache
from voxserve.config import Settings
from voxserve.engines.loaded import Engines
from voxserve.observe.metrics import Metrics
from voxserve.observe.tracing import TurnTracer
from voxserve.pipeline.fallback import FallbackPhrase
from voxserve.pipeline.generations import Lease
from voxserve.pipeline.models.table import ModelTable
from voxserve.pipeline.scheduling.asr_batch import AsrBatcher
from voxserve.pipeline.scheduling.flow import FlowMonitor
from voxserve.pipeline.scheduling.memory_guard import MemoryGuard
from voxserve.pipeline.scheduling.stages import Stages
from voxserve.pipeline.scheduling.tts_health import TtsHealth
from voxserve.pipeline.scheduling.vad_batch import VadBatcher


@dataclass(frozen=True, slots=True, eq=False)
class SpeechParts:
    """What every synthesis of the process shares, besides the stages."""

    cache: TtsCache | None  # None: caching off
    fingerprints: EngineFingerprints  # what of an engine goes into cache keys
    health: TtsHealth  # degraded: only cached speech
    fallback: FallbackPhrase  # spoken instead while degraded
    memory_guard: MemoryGuard  # refuses a synthesis over the memory threshold
    executor: Executor  # where a cancelled synthesis's engine generator is closed


class EngineContext(Protocol):
    """What whole-buffer recognition reads (pipeline/recognition/bulk.py)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def stages(self) -> Stages: ...

    @property
    def engines(self) -> Engines: ...


class SpeechContext(EngineContext, Protocol):
    """What synthesis reads (pipeline/synthesis/synthesize.py): the engines it speaks with, the
    stages, the metrics and the speech parts."""

    @property
    def metrics(self) -> Metrics: ...

    @property
    def speech(self) -> SpeechParts: ...


@dataclass(frozen=True, slots=True, eq=False)
class SessionContext:
    """What one live session reads; its engines and batchers are those of the generation
    it holds `lease` on (released when the session ends), whatever is reloaded meanwhile."""

    settings: Settings
    metrics: Metrics
    stages: Stages
    speech: SpeechParts
    pool: BufferPool  # the audio ring's storage
    flow: FlowMonitor  # the credit window of the session's input
    tracer: TurnTracer | None  # per-turn spans; None when tracing is off
    lease: Lease
    # The named models ([models]): a session that chooses another ASR model mid-way (a
    # Realtime session.update) takes a lease here; None: it cannot (tests' contexts).
    models: ModelTable | None = None

    @property
    def engines(self) -> Engines:
        return self.lease.generation.engines

    def vad_batcher(self) -> VadBatcher:
        return self.lease.generation.vad_batcher()

    def asr_batcher(self) -> AsrBatcher | None:
        return self.lease.generation.asr_batcher()

"""What the scrape-time collectors read, as protocols: the runtime's parts (stages, executor,
pool, generations, memory guard, TTS health and cache, flow control, drain) satisfy them
without this layer importing the pipeline or the cache (read at scrape time only)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class StageState(Protocol):
    """One engine stage's load (pipeline/stage.py)."""

    @property
    def waiting(self) -> int: ...
    @property
    def live_waiting(self) -> int: ...
    @property
    def running(self) -> int: ...
    @property
    def inline_calls(self) -> int: ...
    @property
    def bulk_waiting(self) -> int: ...
    @property
    def bulk_held(self) -> int: ...


class WorkerCounts(Protocol):
    @property
    def workers(self) -> int: ...
    @property
    def queued(self) -> int: ...


class ExecutorState(Protocol):
    @property
    def stats(self) -> WorkerCounts: ...


class PoolState(Protocol):
    @property
    def usage_ratio(self) -> float: ...
    @property
    def in_use(self) -> int: ...
    @property
    def fallbacks(self) -> int: ...


class GenerationState(Protocol):
    @property
    def number(self) -> int: ...
    @property
    def retired(self) -> bool: ...
    @property
    def sessions(self) -> int: ...


class GuardState(Protocol):
    @property
    def threshold(self) -> int: ...
    @property
    def refusals(self) -> Mapping[str, int]: ...


class HealthState(Protocol):
    """TTS health (pipeline/tts_health.py)."""

    @property
    def fallbacks(self) -> int: ...
    @property
    def refused(self) -> int: ...
    def reason(self, waiting: int) -> str | None: ...


class CacheStatsState(Protocol):
    def as_dict(self) -> dict[str, Any]: ...


class CacheState(Protocol):
    def stats(self) -> CacheStatsState: ...


class WindowState(Protocol):
    @property
    def size(self) -> int: ...


class FlowState(Protocol):
    @property
    def stage_windows(self) -> Mapping[str, WindowState]: ...
    @property
    def streams(self) -> int: ...


class DrainState(Protocol):
    @property
    def draining(self) -> bool: ...


class Watched(Protocol):
    """Everything the collectors read, as the runtime holds it."""

    @property
    def ready(self) -> bool: ...
    @property
    def stages(self) -> Mapping[str, StageState]: ...
    @property
    def executor(self) -> ExecutorState: ...
    @property
    def pool(self) -> PoolState: ...
    @property
    def generations(self) -> Sequence[GenerationState]: ...
    @property
    def memory_guard(self) -> GuardState: ...
    @property
    def tts_health(self) -> HealthState: ...
    @property
    def cache(self) -> CacheState | None: ...
    @property
    def flow(self) -> FlowState: ...
    @property
    def drain(self) -> DrainState: ...

"""The process's engine stages by name (vad, asr, responder, tts), shared by every session
and request; each is made on first use, on the running loop.

A mapping of the stages made so far (what flow control judges and the metrics show), plus
`stage(name)` to get one, making it if needed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import Executor

from voxserve.config import PipelineConfig, StageConfig
from voxserve.pipeline.scheduling.stage import CallObserver, EngineStage

STAGE_NAMES = ("vad", "asr", "responder", "tts")


class Stages(Mapping[str, EngineStage]):
    def __init__(
        self,
        cfg: PipelineConfig,
        executor: Executor,
        on_call: CallObserver | None = None,
    ) -> None:
        """`on_call`: told of every call of every stage (the metrics' observer)."""
        self._cfg = cfg
        self._executor = executor
        self._on_call = on_call
        self._made: dict[str, EngineStage] = {}

    def stage(self, name: str) -> EngineStage:
        """The stage `name`, made now if it is the first use."""
        found = self._made.get(name)
        if found is None:
            if name not in STAGE_NAMES:
                raise KeyError(name)
            cfg: StageConfig = getattr(self._cfg, name)
            found = EngineStage(
                name,
                cfg.concurrency,
                cfg.timeout_s,
                self._executor,
                edf=self._cfg.edf,
                inline_below_s=self._cfg.inline_below_us / 1e6,
                bulk_slots=cfg.bulk_slots,
                # A TTS bulk call is one clause: lending it idle slots delays a live reply
                # by one clause at most (pipeline/scheduling/stage.py).
                work_conserving=name == "tts",
            )
            found.on_call = self._on_call
            self._made[name] = found
        return found

    def running(self) -> int:
        """Calls running on every stage together."""
        return sum(stage.running for stage in self._made.values())

    def __getitem__(self, name: str) -> EngineStage:
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._made)

    def __len__(self) -> int:
        return len(self._made)

"""The flow monitor: one task per process that judges the model stages every tick and moves
every stream's credit window, and tells admission when the process is overloaded.

Streams register their input window (a weak reference: a session that ends simply drops
out). Pressure on any stage a stream's audio feeds (VAD, ASR) shrinks its window; a tick
without pressure grows it back. A stage's queue is pressure when it is longer than
`flow.queue_limit`, or, where the stage predicts it (ASR finals held by its batcher:
Batcher.live_lateness), when the held work would start past its deadlines: a count says
nothing about whether 12 finals on a fast engine are late or 3 on a slow one are. The
process keeps a window per stage too: new streams start at it (not at the maximum) while
the stage is under pressure, and it is the exported metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Callable, Mapping

from voxserve.config import FlowConfig
from voxserve.pipeline.scheduling.credit import CreditWindow, StagePressure
from voxserve.pipeline.scheduling.session_demand import SessionDemand
from voxserve.pipeline.scheduling.stage import EngineStage

INPUT_STAGES = ("vad", "asr")  # the stages a stream's audio flows into


class FlowMonitor:
    def __init__(
        self,
        cfg: FlowConfig,
        stages: Mapping[str, EngineStage],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self._stages = stages
        self._clock = clock
        self._pressure: dict[str, StagePressure] = {}
        self.stage_windows: dict[str, CreditWindow] = {}
        # The last tick's prediction per stage that makes one (seconds past its deadline
        # the held live work that fares worst would start; 0: on time): a metric.
        self.predicted_late: dict[str, float] = {}
        self._streams: weakref.WeakSet[CreditWindow] = weakref.WeakSet()
        self._task: asyncio.Task[None] | None = None
        self.ticks = 0
        # What a live stream costs the ASR engine, once the stage exists and measures its
        # busy share (session_demand.py); None: not yet, or `flow.asr_busy_limit` is 0 (off).
        self.demand: SessionDemand | None = None

    def input_window(self) -> CreditWindow:
        """A new stream's input window, registered; it starts at the tightest input-stage
        window of the process."""
        start = min(
            (w.size for name, w in self.stage_windows.items() if name in INPUT_STAGES),
            default=self.cfg.credit_window,
        )
        window = CreditWindow(self.cfg.credit_window, size=start)
        self._streams.add(window)
        demand = self._demand()
        if demand is not None:
            demand.started()
        return window

    def stream_admitted(self) -> None:
        """Admission let a session in (server/session/admission.py): counted at once, so
        a burst admitted in one loop turn does not all see the same room."""
        demand = self._demand()
        if demand is not None:
            demand.admitted()

    def _demand(self) -> SessionDemand | None:
        """The ASR stream-cost model, made once the ASR stage measures its busy share."""
        if self.demand is None and self.cfg.asr_busy_limit > 0:
            stage = self._stages.get("asr")
            if stage is not None and stage.busy_share() is not None:

                def busy() -> float:  # the stage's current batcher (a reload makes a new one)
                    return stage.busy_share() or 0.0

                cfg = self.cfg
                self.demand = SessionDemand(
                    busy, limit=cfg.asr_busy_limit, floor=cfg.asr_busy_floor, clock=self._clock
                )
        return self.demand

    def tick(self) -> None:
        """Judge every stage once and move the windows (the task calls this each tick)."""
        now = self._clock()
        self.ticks += 1
        input_pressure = False
        for name, stage in list(self._stages.items()):
            judge = self._pressure.get(name)
            if judge is None:
                cfg = self.cfg
                judge = self._pressure[name] = StagePressure(
                    cfg.queue_limit, cfg.wait_limit_ms / 1000, cfg.calm_s
                )
                self.stage_windows[name] = CreditWindow(self.cfg.credit_window)
            under = judge.judge(
                now,
                # Live work only (pipeline/scheduling/stage.py): bulk waiting its turn is not
                # pressure.
                waiting=stage.live_waiting,
                timeouts=stage.timeouts,
                late=stage.late,
                # The smoothed wait only moves when calls come: it counts while some wait.
                queue_wait=stage.queue_wait if stage.live_waiting else 0.0,
                predicted_late=self._predicted_late(stage),
            )
            window = self.stage_windows[name]
            if under:
                window.pressure()
            else:
                window.healthy()
            input_pressure |= under and name in INPUT_STAGES
        demand = self._demand()
        if demand is not None:
            demand.tick(self._live_streams()[1])
        for stream in list(self._streams):
            if input_pressure:
                stream.pressure()
            else:
                stream.healthy()

    def _predicted_late(self, stage: EngineStage) -> float | None:
        """Where the stage predicts it (ASR finals through its batcher) and the config
        asks for it: how late its held live work would start. None: judge the count."""
        if not self.cfg.predict_lateness:
            return None
        late = stage.predicted_late()
        if late is not None:
            self.predicted_late[stage.name] = late
        return late

    def overloaded(self) -> str | None:
        """The stage that has been under pressure for `shed_after_s` or longer, if any:
        admission refuses new sessions meanwhile. TTS only with `flow.shed_tts`."""
        now = self._clock()
        for name, judge in self._pressure.items():
            if name == "tts" and not self.cfg.shed_tts:
                continue  # judged per synthesis, by predicted lateness (tts_lateness.py)
            if judge.lasted(now) >= self.cfg.shed_after_s:
                return name
        return None

    def refuses_streams(self) -> str | None:
        """The stage a new live stream would take past its limit (session_demand.py):
        admission refuses new sessions then, before their cost shows in the queue."""
        demand = self._demand()
        if demand is None:
            return None
        live, shown = self._live_streams()
        return "asr" if demand.refuses(live - shown) else None

    def _live_streams(self) -> tuple[int, int]:
        """Streams whose session is not over, and those of them that have asked for a final
        (their cost shows in the busy share)."""
        live = [window for window in list(self._streams) if not window.ended]
        return len(live), sum(1 for window in live if window.shown)

    @property
    def stream_share(self) -> float | None:
        """What a live stream has been costing the ASR engine (None: not known yet)."""
        return None if self.demand is None else self.demand.per_stream

    @property
    def streams(self) -> int:
        return len(self._streams)

    def start(self) -> None:
        """Start ticking on the running loop (the app's lifespan does this)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="voxserve-flow-monitor"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        period = self.cfg.tick_ms / 1000
        while True:
            await asyncio.sleep(period)
            self.tick()

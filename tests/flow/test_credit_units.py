"""Credit windows, stage pressure, the flow monitor, the bounded outbox and the audio
hand-off: pure units with an injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from tests.wsclient import as_read
from voxserve.config import FlowConfig
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.scheduling.credit import CreditWindow, StagePressure
from voxserve.pipeline.scheduling.flow import FlowMonitor
from voxserve.pipeline.scheduling.session_demand import SessionDemand
from voxserve.pipeline.synthesis.ahead import AudioAhead

FLOOR = FlowConfig().asr_busy_floor  # the default (0.5) the rule ships with


def test_window_halves_under_pressure_and_grows_back_by_one() -> None:
    changes: list[int] = []
    window = CreditWindow(8)
    window.on_change = changes.append
    assert [window.pressure() for _ in range(4)] == [True, True, True, False]
    assert window.size == 1 and window.shrinks == 3
    for _ in range(10):
        window.healthy()
    assert window.size == 8
    assert changes == [4, 2, 1, 2, 3, 4, 5, 6, 7, 8]


def test_window_bounds() -> None:
    with pytest.raises(ValueError):
        CreditWindow(0)
    assert CreditWindow(8, size=99).size == 8 and CreditWindow(8, size=0).size == 1


def test_stage_pressure_from_a_long_smoothed_wait_and_a_spell_that_survives_a_gap() -> None:
    judge = StagePressure(queue_limit=10, wait_limit_s=0.5, calm_s=1.0)
    assert judge.judge(0.0, waiting=0, timeouts=0, late=0, queue_wait=0.6)
    assert not judge.judge(0.5, waiting=0, timeouts=0, late=0, queue_wait=0.1)
    assert judge.lasted(0.5) == 0.5  # a calm moment does not end the spell
    assert judge.judge(0.7, waiting=11, timeouts=0, late=0)
    assert not judge.judge(1.0, waiting=0, timeouts=0, late=0)
    assert not judge.judge(2.0, waiting=0, timeouts=0, late=0)
    assert judge.lasted(2.0) == 0.0  # calm for calm_s: over


def test_stage_pressure_from_queue_timeouts_and_late_starts() -> None:
    judge = StagePressure(queue_limit=2)
    assert not judge.judge(0.0, waiting=2, timeouts=0, late=0)
    assert judge.judge(1.0, waiting=3, timeouts=0, late=0) and judge.since == 1.0
    assert judge.judge(2.0, waiting=0, timeouts=1, late=0)  # a timeout since the last tick
    assert judge.lasted(2.5) == 1.5
    assert judge.judge(3.0, waiting=0, timeouts=1, late=1)  # a late start
    assert not judge.judge(4.0, waiting=0, timeouts=1, late=1)  # nothing new: healthy
    assert judge.since is None and judge.lasted(5.0) == 0.0


def test_a_stage_that_predicts_is_judged_by_its_prediction_not_its_count() -> None:
    """Held finals predicted on time are no pressure however many; one predicted to start
    late is, with an empty queue count. Waits, timeouts and late starts still count."""
    judge = StagePressure(queue_limit=2)
    assert not judge.judge(0.0, waiting=12, timeouts=0, late=0, predicted_late=0.0)
    assert judge.judge(1.0, waiting=0, timeouts=0, late=0, predicted_late=0.05)
    assert judge.judge(2.0, waiting=0, timeouts=0, late=1, predicted_late=0.0)
    assert not judge.judge(3.0, waiting=0, timeouts=0, late=1, predicted_late=0.0)
    assert judge.judge(4.0, waiting=3, timeouts=0, late=1)  # no prediction: the count


@dataclass
class StageLoad:
    """What the flow monitor reads of an EngineStage."""

    waiting: int = 0
    timeouts: int = 0
    late: int = 0
    queue_wait: float = 0.0
    bulk_waiting: int = (
        0  # bulk callers among `waiting`: not pressure (pipeline/scheduling/stage.py)
    )

    name: str = "asr"
    predict: Callable[[], float] | None = None  # where a batcher predicts (ASR)
    busy: Callable[[], float] | None = None  # where a batcher measures it (ASR)

    def predicted_late(self) -> float | None:
        return None if self.predict is None else self.predict()

    def busy_share(self) -> float | None:
        return None if self.busy is None else self.busy()

    @property
    def live_waiting(self) -> int:
        return self.waiting - self.bulk_waiting


def test_monitor_reads_a_stages_prediction_unless_told_to_count() -> None:
    """The monitor asks a stage that predicts (and shows the answer as a metric); with
    `flow.predict_lateness` off it judges the count, as before."""
    late = [0.0]
    asr = StageLoad(waiting=9, predict=lambda: late[0])
    monitor = FlowMonitor(FlowConfig(queue_limit=4), {"asr": asr})  # type: ignore[dict-item]
    monitor.tick()
    assert monitor.stage_windows["asr"].size == 8 and monitor.predicted_late == {"asr": 0.0}
    late[0] = 0.3
    asr.waiting = 0
    monitor.tick()
    assert monitor.stage_windows["asr"].size == 4 and monitor.predicted_late["asr"] == 0.3
    counting = FlowMonitor(
        FlowConfig(queue_limit=4, predict_lateness=False),
        {"asr": StageLoad(waiting=9, predict=lambda: 0.0)},  # type: ignore[dict-item]
    )
    counting.tick()
    assert counting.stage_windows["asr"].size == 4 and counting.predicted_late == {}


def test_monitor_moves_stream_windows_and_sheds_after_sustained_pressure() -> None:
    now = [0.0]
    asr = StageLoad()
    stages = {"asr": asr, "tts": StageLoad()}
    cfg = FlowConfig(credit_window=8, queue_limit=1, shed_after_s=1.0, calm_s=0.4)
    monitor = FlowMonitor(cfg, stages, clock=lambda: now[0])  # type: ignore[arg-type]
    stream = monitor.input_window()
    assert stream.size == 8 and monitor.streams == 1
    asr.waiting = 5
    for step in range(3):
        now[0] = step * 0.5
        monitor.tick()
    assert stream.size == 1 and monitor.stage_windows["asr"].size == 1
    assert monitor.stage_windows["tts"].size == 8  # tts had no pressure
    assert monitor.overloaded() == "asr"  # under pressure since t=0, now t=1.0
    late_joiner = monitor.input_window()
    assert late_joiner.size == 1  # new streams start at the stage's window
    asr.waiting = 0
    now[0] = 1.5
    monitor.tick()
    assert monitor.overloaded() == "asr"  # calm for less than calm_s: the spell goes on
    assert stream.size == 2 and late_joiner.size == 2
    now[0] = 2.0
    monitor.tick()
    assert monitor.overloaded() is None
    del stream, late_joiner
    assert monitor.streams == 0  # windows are held weakly: ended sessions drop out


def test_tts_pressure_does_not_shrink_input_windows() -> None:
    tts = StageLoad(waiting=9)
    monitor = FlowMonitor(FlowConfig(queue_limit=0), {"tts": tts})  # type: ignore[dict-item]
    stream = monitor.input_window()
    monitor.tick()
    assert stream.size == 8 and monitor.stage_windows["tts"].size == 4


async def test_outbox_reports_a_stalled_reader() -> None:
    outbox = Outbox(2, stall_s=0.1)
    await outbox.event({"n": 1})
    await outbox.audio(b"\0\0")
    with pytest.raises(VoxError) as caught:
        await outbox.event({"n": 3})
    assert caught.value.code is ErrorCode.CLIENT_STALLED and caught.value.fatal
    assert outbox.stalled and not outbox.close_nowait()
    assert await outbox.next() == {"n": 1}  # what was queued is still in order


async def test_outbox_without_stall_limit_waits_for_the_reader() -> None:
    outbox = Outbox(1)
    await outbox.event({"n": 1})
    waiting = asyncio.create_task(outbox.event({"n": 2}))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    assert await outbox.next() == {"n": 1}
    await waiting
    assert await outbox.next() == {"n": 2} and not outbox.stalled


async def test_audio_ahead_is_bounded_by_audio_length_and_keeps_order() -> None:
    ahead = AudioAhead(max_samples=300)
    chunk = np.zeros(200, dtype=np.int16)
    await ahead.put(chunk)
    await ahead.put({"type": "tts.fallback"})  # events do not count against the bound
    await ahead.put(chunk)  # 200 < 300: accepted, now 400 queued
    blocked = asyncio.create_task(ahead.put(chunk))
    await asyncio.sleep(0.02)
    assert not blocked.done() and ahead.samples == 400
    first = await ahead.get()
    assert isinstance(first, np.ndarray)
    await asyncio.wait_for(blocked, 1)
    assert await ahead.get() == {"type": "tts.fallback"}
    ahead.finish(RuntimeError("engine failed"))
    assert isinstance(await ahead.get(), np.ndarray)
    assert isinstance(await ahead.get(), np.ndarray)
    with pytest.raises(RuntimeError):
        await ahead.get()


async def test_session_tells_a_shrinking_window_at_once_and_growth_sparingly() -> None:
    from tests.fakes import fake_runtime
    from voxserve.config import load_settings
    from voxserve.events import StreamConfig
    from voxserve.pipeline.session import Session

    settings = load_settings()
    outbox = Outbox(64)
    session = Session(fake_runtime(settings).session_context(), StreamConfig(mode="asr"), outbox)
    credit = session.credit
    assert credit is not None and credit.size == 8
    credit.pressure()
    credit.pressure()  # 8 -> 4 -> 2: both told at once
    for _ in range(5):
        credit.healthy()  # 3, 4, 5, 6, 7 within a second: told at most once
    credit.healthy()  # 8, whole again: told
    told = []
    while outbox.qsize():
        event = as_read(await outbox.next())
        assert isinstance(event, dict) and event["type"] == "credit"
        told.append(event["window"])
    assert told == [4, 2, 8]
    session.release()


def test_a_streams_share_is_learned_from_the_streams_that_showed_and_bounds_a_burst() -> None:
    """Ten streams that have asked for finals keep the engine 50% busy: 5% each. A burst
    may add streams while the busy share plus theirs stays within 0.88: seven (0.5 + 7 x
    0.05 = 0.85), the eighth is refused (0.9), counted from admission (before their input
    starts) and as live streams that have not shown; once they show, what they really
    cost decides. An admission whose stream never starts is forgotten after 2 s."""
    now, busy = [0.0], [0.5]
    demand = SessionDemand(lambda: busy[0], limit=0.88, floor=FLOOR, clock=lambda: now[0])
    assert not demand.refuses(0)  # nothing measured: nothing refused
    for _ in range(20):
        demand.tick(10)
    assert demand.per_stream == pytest.approx(0.05)
    admitted = 0
    while not demand.refuses(0):
        demand.admitted()
        admitted += 1
    assert admitted == 7
    for _ in range(7):
        demand.started()  # their input windows: live, not shown yet
    assert demand.refuses(7) and not demand.refuses(6)
    busy[0] = 0.55  # they showed, and turned out cheap
    demand.tick(17)
    assert not demand.refuses(0)
    demand.admitted()  # a TTS session: admitted, no input window
    now[0] = 3.0
    assert demand.refuses(0) is False and not demand._admitted


def test_a_quiet_engine_teaches_nothing_and_a_saturated_one_refuses() -> None:
    busy = [0.01]
    demand = SessionDemand(lambda: busy[0], limit=0.9, floor=FLOOR)
    demand.tick(30)
    assert demand.per_stream is None and not demand.refuses(0)  # idle streams: unknown
    busy[0] = 1.0
    demand.tick(30)
    assert demand.refuses(0)  # saturated: one more is past the limit whatever it costs


def test_few_streams_teach_nothing_and_a_lightly_used_engine_admits_a_burst() -> None:
    """An average learned from one or two streams (finals in batches of one, each paying a
    whole engine call) over-prices a burst whose finals batch together: such ticks teach
    nothing. And while the engine is under half busy the rule refuses nothing, whatever
    the share: twenty streams arriving at once are all admitted (the queue's pressure is
    what holds a burst there). Past the floor, the same share refuses."""
    busy = [0.3]
    demand = SessionDemand(lambda: busy[0], limit=0.9, floor=FLOOR)
    for _ in range(20):
        demand.tick(2)
    assert demand.per_stream is None  # two streams: nothing learned
    for _ in range(20):
        demand.tick(3)
    assert demand.per_stream == pytest.approx(0.1)
    for _ in range(20):
        assert not demand.refuses(0)
        demand.admitted()  # 0.3 + 20 x 0.1 = 2.3 projected, but the engine is at 0.3
    busy[0] = 0.6
    assert demand.refuses(0)  # the same twenty, the engine past half busy: refused


def test_the_monitor_counts_new_streams_into_the_asr_stages_demand() -> None:
    """Streams that asked for a final teach the share; those that have not count against
    the room left; ended streams drop out."""
    busy = [0.6]
    asr = StageLoad(busy=lambda: busy[0])
    monitor = FlowMonitor(
        FlowConfig(asr_busy_limit=0.85),
        {"asr": asr},  # type: ignore[dict-item]
        clock=lambda: 10.0,
    )
    assert monitor.refuses_streams() is None  # no share learned yet
    streams = [monitor.input_window() for _ in range(6)]
    for window in streams:
        window.shown = True
    monitor.tick()
    assert monitor.demand is not None and monitor.demand.per_stream == pytest.approx(0.1)
    assert monitor.stream_share == pytest.approx(0.1)
    quiet = monitor.input_window()  # live, silent so far: 0.6 + 2 x 0.1 = 0.8 with a new one
    assert monitor.refuses_streams() is None
    monitor.stream_admitted()  # 0.6 + 3 x 0.1 = 0.9: the next does not fit
    assert monitor.refuses_streams() == "asr"
    quiet.ended = True  # its session ended (its window may live on until a GC pass)
    assert monitor.refuses_streams() is None  # the room is back (the admitted one counted)
    del quiet
    off = FlowMonitor(FlowConfig(asr_busy_limit=0), {"asr": asr})  # type: ignore[dict-item]
    off.stream_admitted()
    assert off.demand is None and off.refuses_streams() is None
    del streams

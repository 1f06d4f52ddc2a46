"""Fairness between sessions at an engine stage (fake engines of scripted cost).

EDF is what keeps one busy session from holding back another: a stream far ahead of its
playback has late deadlines, a new reply's first chunk an early one. Each test also runs
with `edf=False` (plain FIFO, `pipeline.edf`) where that shows the order is EDF's doing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.fakes import FakeTts, fake_runtime
from voxserve.config import Settings
from voxserve.pipeline.scheduling.stage import PRIORITY_BULK, EngineStage, deadline_in
from voxserve.pipeline.synthesis.synthesize import synthesize

COST_S = 0.004  # scripted engine cost per call


async def _occupy(stage: EngineStage, gate: threading.Event) -> asyncio.Future[bool]:
    """Hold the stage's only slot until `gate` is set, so callers queue behind it."""
    blocker = asyncio.ensure_future(stage.run(gate.wait, 5.0))
    while stage.running < stage.concurrency:  # noqa: ASYNC110 (a test poll)
        await asyncio.sleep(0.001)
    return blocker


@pytest.mark.parametrize("edf", [True, False])
async def test_two_sessions_calls_interleave_by_deadline(edf: bool) -> None:
    """Session A queues its whole backlog first; B's calls, due as soon, are not stuck
    behind it: EDF interleaves them call by call (FIFO runs A's backlog first)."""
    executor = ThreadPoolExecutor(2)
    stage = EngineStage("tts", concurrency=1, timeout_s=5.0, executor=executor, edf=edf)
    gate = threading.Event()
    blocker = await _occupy(stage, gate)
    order: list[str] = []

    def work(name: str) -> None:
        order.append(name)
        time.sleep(COST_S)

    t0 = time.monotonic() + 0.5
    calls = [stage.run(work, f"A{k}", deadline=t0 + 0.1 * k) for k in range(6)]
    calls += [stage.run(work, f"B{k}", deadline=t0 + 0.01 + 0.1 * k) for k in range(6)]
    waiting = [asyncio.ensure_future(c) for c in calls]
    await asyncio.sleep(0.01)
    gate.set()
    await asyncio.gather(blocker, *waiting)
    if edf:
        assert order == [f"{s}{k}" for k in range(6) for s in "AB"]
    else:
        assert order == [f"A{k}" for k in range(6)] + [f"B{k}" for k in range(6)]
    executor.shutdown()


async def test_bulk_flood_yields_to_a_live_call() -> None:
    """Prewarm work queued first (bulk priority, due a stage timeout out) does not delay a
    live first chunk that arrives after it: the live call is next."""
    executor = ThreadPoolExecutor(2)
    stage = EngineStage("tts", concurrency=1, timeout_s=5.0, executor=executor)
    gate = threading.Event()
    blocker = await _occupy(stage, gate)
    order: list[str] = []
    bulk = [
        asyncio.ensure_future(
            stage.run(order.append, f"bulk{i}", deadline=deadline_in(5.0), priority=PRIORITY_BULK)
        )
        for i in range(10)
    ]
    await asyncio.sleep(0.005)
    live = asyncio.ensure_future(stage.run(order.append, "live", deadline=deadline_in(0.2)))
    await asyncio.sleep(0.005)
    gate.set()
    await asyncio.gather(blocker, live, *bulk)
    assert order[0] == "live" and len(order) == 11
    executor.shutdown()


async def test_bulk_is_not_starved_by_continuous_live_load() -> None:
    """Live calls arrive faster than the stage serves them, each due 50 ms after arrival.
    A bulk call due 150 ms out still runs once its deadline is the earliest queued: after
    the live calls that arrived before (its deadline - 50 ms), long before the flood ends.
    (A priority-first queue would run it last.)"""
    executor = ThreadPoolExecutor(2)
    stage = EngineStage("tts", concurrency=1, timeout_s=10.0, executor=executor)
    order: list[str] = []
    arrivals: dict[str, float] = {}

    def work(name: str) -> None:
        order.append(name)
        time.sleep(0.01)  # 100 calls/s of capacity against 200/s of arrivals

    t0 = time.monotonic()
    tasks = [
        asyncio.ensure_future(stage.run(work, "bulk", deadline=t0 + 0.15, priority=PRIORITY_BULK))
    ]
    for i in range(80):
        name = f"live{i}"
        arrivals[name] = time.monotonic()
        tasks.append(asyncio.ensure_future(stage.run(work, name, deadline=deadline_in(0.05))))
        await asyncio.sleep(0.005)
    await asyncio.gather(*tasks)
    position = order.index("bulk")
    assert position < 60, position  # not last: the flood went on long after it ran
    ahead = order[:position]
    # Only live calls due before the bulk deadline ran ahead of it.
    assert all(arrivals[name] + 0.05 <= t0 + 0.15 + 0.02 for name in ahead), ahead
    executor.shutdown()


def _tts_settings(edf: bool) -> Settings:
    settings = Settings()
    settings.cache.enabled = False
    settings.pipeline.tts.concurrency = 1
    settings.pipeline.edf = edf
    return settings


@pytest.mark.parametrize("edf", [True, False])
async def test_a_new_reply_is_not_held_back_by_another_sessions_long_replies(edf: bool) -> None:
    """Through the real synthesis path: session A streams eight long replies at once (as
    eight HTTP requests would), each already far ahead of its playback; session B's first
    chunk then waits for the chunk in progress only (FIFO: for A's whole queue)."""
    tts = FakeTts(chunk_delay_s=COST_S, seconds_per_word=0.2)  # 50x faster than real time
    runtime = fake_runtime(_tts_settings(edf), tts=tts)
    made: list[str] = []
    b_asked = asyncio.Event()
    b_first: list[int] = []

    async def session_a(i: int) -> None:
        async for _ in synthesize(runtime, " ".join(["word"] * 200), voice="fake"):
            made.append(f"A{i}")
            if b_asked.is_set() and b_first:
                return

    async def session_b() -> None:
        b_asked.set()
        before = tts.chunks_made
        async for _ in synthesize(runtime, "hello there", voice="fake"):
            b_first.append(tts.chunks_made - before - 1)  # others' chunks made before it
            return

    a_tasks = [asyncio.ensure_future(session_a(i)) for i in range(8)]
    while len(made) < 8 * 12:  # noqa: ASYNC110 (each A reply well ahead of its playback)
        await asyncio.sleep(0.005)
    await session_b()
    await asyncio.gather(*a_tasks)
    if edf:
        assert b_first[0] <= 1, b_first  # only the chunk in progress
    else:
        assert b_first[0] >= 6, b_first  # behind A's queued chunks
    runtime.executor.shutdown()


@pytest.mark.parametrize("edf", [True, False])
async def test_a_chunk_far_ahead_of_playback_waits_outside_a_busy_stage(edf: bool) -> None:
    """A later chunk due well in the future does not join a busy stage's queue (where it
    would count as load for TTS health and flow control) until it is nearly due; it goes at
    once when the stage frees up. With EDF off (plain FIFO) it queues at once."""
    from voxserve.pipeline.synthesis.engine_chunks import QUEUE_HORIZON_S, _until_nearly_due

    executor = ThreadPoolExecutor(2)
    stage = EngineStage("tts", concurrency=1, timeout_s=5.0, executor=executor, edf=edf)
    gate = threading.Event()
    blocker = await _occupy(stage, gate)
    t0 = time.monotonic()
    await _until_nearly_due(stage, t0 + QUEUE_HORIZON_S + 0.15)
    waited = time.monotonic() - t0
    if edf:
        assert 0.14 <= waited < 0.5, waited
        assert stage.waiting == 0  # it waited outside the queue
        freed = asyncio.ensure_future(_until_nearly_due(stage, time.monotonic() + 10.0))
        await asyncio.sleep(0.02)
        assert not freed.done()
        gate.set()
        await asyncio.wait_for(freed, timeout=1.0)  # the stage went idle: no more waiting
    else:
        assert waited < 0.05, waited
        gate.set()
    await blocker
    executor.shutdown()


class _NamedWordsTts(FakeTts):
    """FakeTts that notes each word as it is synthesised (one engine call each)."""

    def __init__(self, **kw: float) -> None:
        super().__init__(**kw)
        self.order: list[str] = []

    def synthesize(self, text: str, *, voice: str, speed: float = 1.0) -> Iterator[np.ndarray]:
        chunks = super().synthesize(text, voice=voice, speed=speed)
        for word, chunk in zip(text.split(), chunks, strict=False):
            self.order.append(word)
            yield chunk


@pytest.mark.parametrize("bulk", [True, False])
async def test_a_second_chunk_is_due_by_its_playback_not_by_its_first_chunk_s_wait(
    bulk: bool,
) -> None:
    """A one-shot request A's first chunk waits 2 s for the slot; its second is then due
    when the first's 2 s of audio have played (less that chunk's synthesis), not at once,
    so B, which asked for its first chunk while A waited and is due sooner than that, goes
    first. (Less the first chunk's whole wait, the tails of requests admitted earlier
    overtook the first chunks the TTS admission rule had counted on: admitted one-shot
    speech came 1-2.4 s past its budget at 2x and 4x capacity, docs/benchmarks.md.) A live
    reply keeps that wait as its lead, so its second chunk goes first: a conversation's
    reply must not pause. (A word is 2 s of audio.)"""
    tts = _NamedWordsTts(chunk_delay_s=0.05, seconds_per_word=2.0)
    runtime = fake_runtime(_tts_settings(True), tts=tts)
    stage = runtime.stages.stage("tts")
    gate = threading.Event()
    blocker = await _occupy(stage, gate)

    async def speak(text: str) -> None:
        async for _ in synthesize(runtime, text, voice="fake", bulk=bulk):
            pass

    a = asyncio.ensure_future(speak("a1 a2"))  # its first chunk due in 0.2 s, queued
    await asyncio.sleep(0.05)
    # Due just after A's first chunk (a live call: for a one-shot A it runs first), it holds
    # the slot while A's second chunk and B's first are asked for.
    holder = asyncio.ensure_future(stage.run(time.sleep, 0.3, deadline=time.monotonic() + 0.25))
    await asyncio.sleep(1.85)
    b = asyncio.ensure_future(speak("b1"))  # due 0.2 s from now, 0.1 s after the gate opens
    await asyncio.sleep(0.1)
    gate.set()
    await asyncio.gather(blocker, holder, a, b)
    if bulk:
        assert tts.order.index("b1") < tts.order.index("a2"), tts.order
    else:
        assert tts.order.index("a2") < tts.order.index("b1"), tts.order
    runtime.executor.shutdown()


async def test_a_one_shot_first_chunk_is_due_when_admission_predicted_it_would_start() -> None:
    """One slot. A one-shot request A speaks (1.5 s of audio a word); a holder takes the slot after
    A's first chunk, so A's second waits for it, and then C1-C3 (first clauses of 199
    characters: 1.6 s each at the prior rate of 8 ms a character) and B are admitted:
    predicted to start 1.6 s apart, B 4.8 s out. A's second chunk is due when its first has
    played (~1.35 s), so it goes before C2, C3 and B, which are due when admission said
    they would start. (Due FIRST_CHUNK_DUE_S after asking, as they were, a queue of first
    chunks outranked every admitted stream's next clause: at 2x capacity nearly every
    admitted stream paused, docs/benchmarks.md.)"""
    tts = _NamedWordsTts(chunk_delay_s=0.05, seconds_per_word=1.5)
    settings = _tts_settings(True)
    settings.tts.degrade.ms_per_char = 8.0
    settings.tts.degrade.one_shot_first_audio_budget_ms = 30_000  # admit all of them
    runtime = fake_runtime(settings, tts=tts)
    stage = runtime.stages.stage("tts")

    async def speak(text: str) -> None:
        async for _ in synthesize(runtime, text, voice="fake", bulk=True):
            pass

    a = asyncio.ensure_future(speak("a1 a2"))
    while not stage.running:  # noqa: ASYNC110 (a test poll)
        await asyncio.sleep(0.001)
    gate = threading.Event()
    holder = asyncio.ensure_future(stage.run(gate.wait, 5.0))  # next in line, after a1
    while "a1" not in tts.order or stage.waiting < 1:  # noqa: ASYNC110 (a2 queued)
        await asyncio.sleep(0.001)
    others = []
    for name in ("c1", "c2", "c3", "b1"):
        text = name if name == "b1" else f"{name} {'x' * 196}"  # 199 characters, one clause
        others.append(asyncio.ensure_future(speak(text)))
        await asyncio.sleep(0.005)  # admitted in this order
    await asyncio.sleep(0.02)
    gate.set()
    await asyncio.gather(holder, a, *others)
    order = [w for w in tts.order if w in ("a2", "c1", "c2", "c3", "b1")]
    assert order.index("a2") < order.index("c2") < order.index("c3") < order.index("b1"), order
    runtime.executor.shutdown()


class _FirstPieceTts(_NamedWordsTts):
    """An engine that offers the first-piece choice (engines/base.py, short_first_piece),
    noting what each request asked for."""

    short_first_piece = True

    def __init__(self, **kw: float) -> None:
        super().__init__(**kw)
        self.asked: list[bool] = []

    def synthesize(  # type: ignore[override]
        self, text: str, *, voice: str, speed: float = 1.0, short_first: bool = True
    ) -> Iterator[np.ndarray]:
        self.asked.append(short_first)
        return super().synthesize(text, voice=voice, speed=speed)


@pytest.mark.parametrize("bulk", [True, False])
async def test_a_live_reply_asks_for_a_short_first_piece_and_a_one_shot_request_does_not(
    bulk: bool,
) -> None:
    """An engine that offers the choice is asked for a short first piece for a live reply
    (its first audio is the turn's latency) and not for a one-shot request (in a burst the
    clause after a short first piece waited behind the other requests' first pieces, and
    its listener paused). An engine without the choice is asked nothing: its `synthesize`
    takes no such keyword (a call with it would raise TypeError)."""
    tts = _FirstPieceTts(chunk_delay_s=0.01, seconds_per_word=0.3)
    runtime = fake_runtime(_tts_settings(True), tts=tts)
    async for _ in synthesize(runtime, "a1 a2", voice="fake", bulk=bulk):
        pass
    assert tts.asked == [not bulk]
    assert tts.order == ["a1", "a2"]
    runtime.executor.shutdown()
    plain = _NamedWordsTts(chunk_delay_s=0.01, seconds_per_word=0.3)
    runtime = fake_runtime(_tts_settings(True), tts=plain)
    async for _ in synthesize(runtime, "s1 s2", voice="fake", bulk=bulk):
        pass
    assert plain.order == ["s1", "s2"]
    runtime.executor.shutdown()

"""TTS admission by predicted lateness (pipeline/scheduling/tts_lateness.py, tts_health.py), with a
fake clock: a burst that fits is admitted whole, the first request past the deadline is
refused with a retry hint, a reply buffered ahead of playback yields to a new first clause,
one about to run dry does not, and the service rate is measured."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.cache.helpers import cache_settings, loaded_runtime
from tests.fakes import FakeTts
from voxserve.config import DegradeConfig
from voxserve.errors import ErrorCode
from voxserve.pipeline.scheduling.tts_health import TtsDegraded, TtsHealth
from voxserve.pipeline.scheduling.tts_lateness import (
    CONTINUITY_SHARE,
    SHARE_CUT,
    SHARE_MIN,
    SHARE_RECOVERY_PER_S,
    STARVED_S,
    Prediction,
    ServiceRates,
    Ticket,
    TtsSchedule,
    _Demand,
    overrun_s,
)
from voxserve.pipeline.synthesis.synthesize import synthesize

CLAUSE = "Twenty characters!!!"  # 20 characters, one sentence


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def schedule(clock: Clock, budget_s: float = 1.0, ms_per_char: float = 10.0) -> TtsSchedule:
    """10 ms a character: a 20-character first clause costs 0.2 s. The engine's set-up call
    is behind it (it is not measured)."""
    rates = ServiceRates(ms_per_char / 1000, 0.5)
    rates.observe_call("fake/fake", 9.0, 1.0)
    assert rates.rates == {}
    return TtsSchedule(budget_s, rates, clock)


def test_a_burst_that_fits_is_admitted_and_the_first_that_would_miss_is_not() -> None:
    clock = Clock()
    s = schedule(clock)
    fits = []
    for _ in range(12):
        ticket = s.open("fake/fake", f"{CLAUSE} {CLAUSE}", bulk=False)
        fits.append(s.predict(ticket, slots=2).fits)
    # The n-th waits for (n-1) first clauses of 0.2 s over 2 slots, then takes 0.2 s itself:
    # 0.1 * (n-1) + 0.2 <= 1.0 for n <= 9.
    assert fits == [True] * 9 + [False] * 3
    late = s.predict(ticket, slots=2)
    assert late.first_audio_s == pytest.approx(0.1 * 11 + 0.2)
    assert late.retry_after_s() == 1
    assert s.predict(ticket, slots=4).fits  # twice the slots: the same burst fits


def test_a_reply_buffered_ahead_of_playback_yields_to_a_new_first_clause() -> None:
    clock = Clock()
    s = schedule(clock)
    speaking = s.open("fake/fake", " ".join([CLAUSE] * 10), bulk=False)
    s.call_cost(speaking)
    s.call_done(speaking, 0.2, 1.3)  # its first clause: 1.3 s of audio, past our deadline
    new = s.open("fake/fake", CLAUSE, bulk=False)
    assert s.predict(new, slots=1).wait_s == 0.0  # its tail is not due before our deadline
    clock.now += 0.8  # its playback has 0.5 s left: its next clause is due first
    newer = s.open("fake/fake", CLAUSE, bulk=False)
    s.close(new)
    assert s.predict(newer, slots=1).wait_s > 0.2


def test_work_in_progress_counts_only_its_rest_and_finished_work_sets_the_rate() -> None:
    clock = Clock()
    s = schedule(clock)
    running = s.open("fake/fake", CLAUSE, bulk=False)
    s.call_cost(running)
    running.call_started = clock.now
    clock.now += 0.15
    new = s.open("fake/fake", CLAUSE, bulk=False)
    assert s.predict(new, slots=1).wait_s == pytest.approx(0.05)
    s.call_done(running, 0.4, 1.0)
    s.finished(running)
    assert s.ms_per_char == {"fake/fake": pytest.approx(20.0)}  # 0.4 s / 20 characters
    assert s.predict(new, slots=1).first_audio_s == pytest.approx(0.4)  # nothing ahead now
    assert s.active == 1


def test_bulk_requests_count_live_work_only_where_it_shares_their_slots() -> None:
    """On a stage that reserves slots for live work (`live_apart`), a one-shot request is
    judged on bulk work only; on the work-conserving TTS stage it shares every slot with
    live replies, so those arrived before it are ahead of it."""
    clock = Clock()
    s = schedule(clock)
    for _ in range(10):
        s.open("fake/fake", CLAUSE, bulk=False)
    bulk = s.open("fake/fake", CLAUSE, bulk=True)
    assert s.predict(bulk, slots=1, live_apart=True).wait_s == 0.0
    assert s.predict(bulk, slots=2).wait_s == pytest.approx(10 * 0.2 / 2)
    live = s.open("fake/fake", CLAUSE, bulk=False)
    assert s.predict(live, slots=2).wait_s == pytest.approx(11 * 0.2 / 2)


def test_one_shot_requests_have_their_own_budget() -> None:
    """A one-shot request is due its first audio `one_shot_budget_s` after it arrives, a
    live reply `budget_s`: the same work ahead fits one and not the other."""
    clock = Clock()
    s = TtsSchedule(1.0, ServiceRates(0.01, 0.2), clock, one_shot_budget_s=4.0)
    for _ in range(12):
        s.open("fake/fake", CLAUSE, bulk=True)  # 12 first clauses of 0.2 s: 1.2 s on 2
    live = s.open("fake/fake", CLAUSE, bulk=False)
    one_shot = s.open("fake/fake", CLAUSE, bulk=True)
    assert not s.predict(live, slots=2).fits
    assert s.predict(one_shot, slots=2).fits and s.predict(one_shot, slots=2).budget_s == 4.0


def test_health_refuses_late_with_a_retry_hint_and_counts_it_by_reason() -> None:
    clock = Clock()
    config = DegradeConfig(first_audio_budget_ms=500, ms_per_char=10.0)
    health = TtsHealth(config, clock)
    alone = health.schedule.open("fake/fake", CLAUSE * 10, bulk=False)
    assert health.admit(alone, 0, 1).late_s > 0  # late, but nothing ahead: admitted
    health.schedule.close(alone)
    admitted = 0
    with pytest.raises(TtsDegraded) as refused:
        for _ in range(10):
            health.admit(health.schedule.open("fake/fake", CLAUSE, bulk=False), 0, 1)
            admitted += 1
    assert admitted == 2  # 0.2 s, then 0.2 + 0.2; a third would be at 0.6 s
    assert refused.value.code is ErrorCode.TTS_DEGRADED and refused.value.reason == "late"
    assert refused.value.retry_after_s == 1
    assert health.refusals == {"late": 1} and health.schedule.active == 2
    off = TtsHealth(config.model_copy(update={"predict": False}), clock)
    for _ in range(10):
        off.admit(off.schedule.open("fake/fake", CLAUSE, bulk=False), 0, 1)


def speaks(s: TtsSchedule, ticket: Ticket) -> Ticket:
    """`ticket`'s first clause (0.2 s of engine, 1.3 s of audio) has just been made."""
    s.call_cost(ticket)
    s.call_done(ticket, 0.2, 1.3)
    return ticket


def speaking(s: TtsSchedule, clock: Clock, sentences: int, *, bulk: bool = True) -> Ticket:
    """A stream of `sentences` clauses whose first is made: ~15% of a slot as it plays on."""
    ticket = s.open("fake/fake", " ".join([CLAUSE] * sentences), bulk=bulk)
    s.predict(ticket, slots=2)
    return speaks(s, ticket)


def admit_while_playing(s: TtsSchedule) -> tuple[list[Ticket], Ticket, Prediction]:
    """Long one-shot streams (20 clauses, 1.3 s of audio each: ~15% of a slot as they play)
    admitted one by one, each speaking at once, until one is refused: the admitted, the
    refused ticket and its prediction."""
    s.one_shot_budget_s = 4.0
    s.rates.of("fake/fake").audio_s_per_char = 1.3 / 20  # what its first calls make
    streams: list[Ticket] = []
    for _ in range(100):  # a bound, should admission never refuse
        new = s.open("fake/fake", " ".join([CLAUSE] * 20), bulk=True)
        late = s.predict(new, slots=2)
        if not late.fits:
            break
        streams.append(speaks(s, new))
    return streams, new, late


def test_a_one_shot_request_that_would_make_admitted_streams_pause_is_refused() -> None:
    """Each stream needs 0.2 s of engine a clause, one clause every 1.3 s of its playback:
    ~0.154 of a slot. Streams are admitted one by one, each speaking at once; the first
    refused is on time by the first-audio rule alone (the others' first clauses are done),
    refused because with it the engine would fall behind their playback (reason `behind`,
    a retry hint), when the streams playing fill the share of the slots their playback may
    take (CONTINUITY_SHARE of two). With `continuity` off it is admitted, as before."""
    s = schedule(Clock(), budget_s=4.0)
    streams, new, late = admit_while_playing(s)
    rate = s.rates.of("fake/fake")
    playing = len(streams)
    assert playing * rate.compute_per_audio_s <= 2 * CONTINUITY_SHARE, playing
    assert (playing + 2) * rate.compute_per_audio_s > 2 * CONTINUITY_SHARE, playing
    assert late.first_audio_s <= late.budget_s, late  # on time by the first-audio rule
    assert late.behind_s > 0 and late.retry_after_s() >= 1, late
    assert s.predict(new, slots=3).fits  # a third slot keeps them all playing
    s.continuity = False
    assert s.predict(new, slots=2).fits
    s.continuity = True
    for stream in streams[:2]:  # two streams end: room for one more
        s.close(stream)
    assert s.predict(new, slots=2).fits


def test_a_one_shot_burst_of_first_clauses_is_bounded_by_first_audio_alone() -> None:
    """A burst of one-clause requests: the first clauses fill both slots up to the deadline,
    which the first-audio prediction allows, and nothing plays on after them. Each is
    admitted while its first audio is on time; the first refused is late, not behind. Only
    playback is held to CONTINUITY_SHARE of the slots: a margin on first clauses too refused
    a Wyoming burst of 16 that the engine served without a pause."""

    def burst(continuity: bool) -> tuple[int, Prediction]:
        s = schedule(Clock(), budget_s=4.0)
        s.one_shot_budget_s, s.continuity = 4.0, continuity
        admitted = 0
        while (late := s.predict(s.open("fake/fake", CLAUSE, bulk=True), slots=2)).fits:
            admitted += 1
        return admitted, late

    admitted, late = burst(continuity=True)
    # The n-th waits for (n-1) first clauses of 0.2 s over 2 slots, then takes 0.2 s: ~39.
    assert admitted == burst(continuity=False)[0] and admitted >= 38, admitted
    assert late.late_s > 0 and late.behind_s == 0.0, late


def test_a_stream_that_runs_dry_cuts_the_playback_share_which_recovers_while_none_does() -> None:
    """The share of the slots playback may take is learned from admitted streams: one whose
    next chunk comes over STARVED_S after its audio ran out cuts it (once per cluster), and
    it recovers while none does; admission then lets fewer streams play at once."""
    clock = Clock()
    s = schedule(clock, budget_s=4.0)
    s.one_shot_budget_s = 4.0
    assert s.playback_share() == CONTINUITY_SHARE
    on_time, dry, other = (speaking(s, clock, 3) for _ in range(3))  # 1.3 s of audio each
    clock.now += 1.3 + STARVED_S / 2  # a chunk just inside the tolerance: no pause heard
    s.call_cost(on_time)
    s.call_done(on_time, 0.2, 1.3)
    assert s.starved == 0 and s.playback_share() == CONTINUITY_SHARE
    clock.now += STARVED_S  # the others' audio ran out over STARVED_S ago
    s.call_cost(dry)
    s.call_done(dry, 0.2, 1.3)
    assert s.starved == 1
    assert s.playback_share() == pytest.approx(CONTINUITY_SHARE * SHARE_CUT)
    s.call_cost(other)
    s.call_done(other, 0.2, 1.3)  # the same cluster of late clauses: counted, not cut again
    assert s.starved == 2
    assert s.playback_share() == pytest.approx(CONTINUITY_SHARE * SHARE_CUT)
    clock.now += 10.0
    cut = CONTINUITY_SHARE * SHARE_CUT + 10 * SHARE_RECOVERY_PER_S
    assert s.playback_share() == pytest.approx(cut)
    for ticket in (on_time, dry, other):
        s.close(ticket)
    full = len(admit_while_playing(schedule(Clock(), budget_s=4.0))[0])
    lowered = schedule(Clock(), budget_s=4.0)
    lowered._share, lowered._cut_at = SHARE_MIN, lowered.clock()  # as cut to its floor
    assert len(admit_while_playing(lowered)[0]) < full
    clock.now += 1000.0  # never past where it started
    assert s.playback_share() == CONTINUITY_SHARE


def test_a_fresh_schedule_keeps_the_rates_and_forgets_the_share() -> None:
    """`TtsSchedule.fresh`: set up as the old one (budgets, clock, continuity) with its
    measured rates, and the playback share and counts of a new server."""
    clock = Clock()
    s = schedule(clock, budget_s=0.8)
    s.one_shot_budget_s = 4.0
    s._share, s._cut_at, s.starved = SHARE_MIN, clock(), 3  # as cut to its floor
    new = s.fresh()
    assert new.rates is s.rates and new.clock is s.clock
    assert (new.budget_s, new.one_shot_budget_s, new.continuity) == (0.8, 4.0, s.continuity)
    assert new.playback_share() == CONTINUITY_SHARE and new.starved == 0
    assert not new.tickets and s.playback_share() == SHARE_MIN


def test_a_stream_buffered_ahead_needs_nothing_until_its_playback_comes_near() -> None:
    """Streams whose audio is made far ahead of their playback are no load until it plays
    out, and short texts end: the balance is over time, not a count of streams."""
    clock = Clock()
    s = schedule(clock, budget_s=1.0)
    s.one_shot_budget_s = 1.0
    short = [speaking(s, clock, 1) for _ in range(30)]  # one clause each: all made
    assert all(t.chars_done == t.chars for t in short)
    new = s.open("fake/fake", " ".join([CLAUSE] * 20), bulk=True)
    assert s.predict(new, slots=2).behind_s == 0.0


def test_live_replies_are_not_refused_for_continuity_but_count_in_it() -> None:
    """A live reply gets the fallback phrase only when its first audio would be late; its
    playback is in the balance of the one-shot requests after it."""
    clock = Clock()
    s = schedule(clock, budget_s=0.8)  # a live reply's budget: its tails are due after it
    s.one_shot_budget_s = 4.0
    s.rates.of("fake/fake").audio_s_per_char = 1.3 / 20
    for _ in range(14):
        speaking(s, clock, 20, bulk=False)
    live = s.open("fake/fake", " ".join([CLAUSE] * 20), bulk=False)
    assert s.predict(live, slots=2).fits
    one_shot = s.open("fake/fake", " ".join([CLAUSE] * 20), bulk=True)
    assert s.predict(one_shot, slots=2).behind_s > 0
    # On a stage that keeps live work apart, live replies are not in a one-shot's balance.
    assert s.predict(one_shot, slots=1, live_apart=True).behind_s == 0.0


def test_the_balance_peaks_where_a_step_lands_or_a_ramp_ends() -> None:
    """`overrun_s`, by hand: one slot from t=0; 1 s due at t=1 (on time), then a stream
    needing the whole slot from t=1 for 2 s and half of it from t=2 for 2 s: at t=3,
    1 + 2 + 0.5 = 3.5 s due against 3 s: 0.5 s behind, its worst."""
    demands = [
        _Demand(1.0, 1.0),
        _Demand(0.0, 0.0, 1.0, 1.0, 2.0),
        _Demand(0.0, 0.0, 2.0, 0.5, 1.0),
    ]
    assert overrun_s(demands, 0.0, 1, 0.0) == pytest.approx(0.5)
    assert overrun_s(demands, 0.0, 2, 0.0) <= 0  # two slots keep up
    assert overrun_s(demands[:1], 0.0, 1, 0.0) == pytest.approx(0.0)  # just in time


class LoggingTts(FakeTts):
    """A fake engine that logs which text each chunk it makes belongs to."""

    def __init__(self) -> None:
        super().__init__(chunk_delay_s=0.1, seconds_per_word=3.0)  # 3 s of audio a word
        self.log: list[str] = []

    def synthesize(self, text: str, *, voice: str, speed: float = 1.0) -> Iterator[np.ndarray]:
        for chunk in super().synthesize(text, voice=voice, speed=speed):
            self.log.append(text.split()[0])
            yield chunk


async def test_a_new_first_chunk_overtakes_replies_speaking_ahead_of_playback(
    tmp_path: Path,
) -> None:
    """First chunks first: one slot, four long replies speaking, each seconds ahead of its
    playback; a new request's first chunk is made right after the chunk in progress, not
    after the tails in line (first come, first served would put ~3 before it)."""
    degrade = {"enabled": True, "first_audio_budget_ms": 10_000}  # ordering, not refusals
    settings = cache_settings(tmp_path, degrade=degrade, enabled=False)
    pipeline = settings.pipeline.model_copy(
        update={"tts": settings.pipeline.tts.model_copy(update={"concurrency": 1})}
    )
    tts = LoggingTts()
    runtime = await loaded_runtime(settings.model_copy(update={"pipeline": pipeline}), tts)
    got: list[str] = []

    async def speak(name: str) -> None:
        async for _ in synthesize(runtime, f"{name} " * 30):
            got.append(name)

    tasks = [asyncio.create_task(speak(f"long{i}")) for i in range(4)]
    try:
        while not all(tts.log.count(f"long{i}") >= 2 for i in range(4)):
            assert not any(task.done() for task in tasks)
            await asyncio.sleep(0.01)
        before = len(tts.log)
        await anext(synthesize(runtime, "short one"))
        between = tts.log[before:].index("short")
        assert between <= 1, tts.log  # at most the chunk that was being made
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runtime.aclose()

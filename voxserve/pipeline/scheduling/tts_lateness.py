"""Will a new synthesis's first audio come in time? The TTS admission rule (issue 26).

Every synthesis that needs the engine holds a `Ticket` from start to end. A ticket knows its
text's length, whether its first clause is done, and, once it speaks, when its listener's
playback runs dry (its first chunk's time + the audio made so far). The service rate is
measured, not configured: per engine/voice an EWMA of engine seconds per audio second, from
every engine call (so it follows the machine's load within a burst), and of audio seconds
per character, from every finished synthesis; their product is engine seconds per
character (`tts.degrade.ms_per_char` is only the prior before the first call).

A new request is due its first audio a budget after it arrives: a live session's reply
`tts.degrade.first_audio_budget_ms`, a one-shot request (HTTP speech, gRPC, Wyoming
`synthesize`) `tts.degrade.one_shot_first_audio_budget_ms`. Its start is predicted from the
work ahead of it in the TTS stage's earliest-deadline-first order (pipeline/scheduling/stage.py),
spread over the slots the stage will give its class (`EngineStage.slots_for`: every slot on
the work-conserving TTS stage, live and one-shot work alike, so both count ahead):
- the rest of every call running now;
- every admitted first clause not started yet (first chunks are due FIRST_CHUNK_DUE_S after
  arrival, so earlier arrivals go first), and not its tail: that is due when the first
  clause's audio has played (1.6 s or more for piper's sentences), after every first clause
  of its burst, so EDF serves it later. Counting it would double a burst's predicted wait
  and refuse the last third of 16 two-sentence requests that the stage serves in time;
- of every request already speaking, the clauses its playback needs before the new
  request's deadline (a clause due when its predecessors' audio ends); a reply buffered
  far ahead of its playback needs none, so a new first clause overtakes its tail.
Refused (or, for a live reply, answered with the fallback phrase) when the predicted
first audio is past the deadline; a burst that fits is queued and served.

A one-shot request is also refused when admitting it would make an admitted stream pause
(`continuity`, on by default): from its deadline on, can the engine keep every admitted
stream and this one playing at real time? Each stream needs its engine time as its
listener plays (engine seconds per audio second, measured, over the share of the slots
playback may take, learned from admitted streams that ran dry: CONTINUITY_SHARE), a clause
ahead of its playback;
a first clause not started yet is due when its first audio was predicted. The work due by
each moment T, against the slots' time until T, at every moment where that balance can peak
(`_Demand`, `overrun_s`). Without it, admission promised first audio only: at 2x and 4x
capacity nearly every admitted stream paused between clauses (longest pause P50 2.4-2.7 s),
as ~50 admitted streams playing at once need twice the audio two slots make. A live reply
is not refused for it (its fallback phrase is worse than another stream's pause), but its
playback counts in the balance of the one-shot requests after it. Pure: the clock is
injected, so the rules are tested with a fake one (tests/test_tts_lateness.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from voxserve.text import sentence_pieces

FIRST_CLAUSE_MAX_CHARS = 200  # voxserve/text.py MAX_PIECE_CHARS: engines cut pieces there


def first_clause_chars(text: str) -> int:
    """The length of the text's first sentence (at most a piece): what the first chunk
    costs. An overestimate when the engine cuts clauses finer, which errs on the safe side."""
    pieces = sentence_pieces(text)
    first = pieces[0].strip() if pieces else text
    return max(1, min(len(first), len(text), FIRST_CLAUSE_MAX_CHARS))


# The share of the slots that admitted streams' playback may take in the continuity balance
# (`TtsSchedule._demand`: the engine time a stream needs as it plays is counted at its
# measured cost over this share). Playback is sustained work, where a rate measured a little
# low, clauses coming in steps and two non-preemptive slots let clusters of clauses late;
# first clauses and calls in progress are counted at cost, as the first-audio prediction
# counts them. No one share fits every load (docs/benchmarks.md, "TTS overload: admitted
# speech keeps playing"): 0.7 refused 3 of 12 SDK requests at once that played without a
# pause (and, over the first clauses too, 3-5 of a Wyoming burst of 16), yet under
# sustained 2x overload counting playback at cost left ~60% of admitted streams pausing.
# So it is learned: it starts at CONTINUITY_SHARE, an admitted stream that runs dry (its
# next chunk made over STARVED_S after its audio ran out) cuts it by SHARE_CUT (at most once
# per SHARE_CUT_SPACING_S: one cluster of late clauses is one mistake), and it recovers by
# SHARE_RECOVERY_PER_S while none runs dry, never past CONTINUITY_SHARE nor under SHARE_MIN.
CONTINUITY_SHARE = 0.9
SHARE_MIN = 0.5
SHARE_CUT = 0.85
SHARE_CUT_SPACING_S = 1.0
SHARE_RECOVERY_PER_S = 0.01
STARVED_S = 0.1  # the gap a listener hears as a pause (bench tts-burst's PAUSE_S)
DEFAULT_AUDIO_S_PER_CHAR = 0.065  # ~15 characters a second of speech, until measured


@dataclass
class Rate:
    """One engine/voice's measured cost: engine seconds per audio second (per engine call:
    it adapts within a burst), audio seconds per character (per finished synthesis), and
    what a first call costs per character of the first clause (engines differ in how much
    text their first call takes: a clause for piper, a word for some)."""

    compute_per_audio_s: float
    audio_s_per_char: float
    first_s_per_char: float  # a first call's engine seconds per first-clause character
    calls: int = 0
    texts: int = 0
    firsts: int = 0

    @property
    def compute_s_per_char(self) -> float:
        return self.compute_per_audio_s * self.audio_s_per_char


class ServiceRates:
    """EWMAs per engine/voice key; an unmeasured key borrows the mean of the measured ones,
    else the prior (`prior_s_per_char`)."""

    def __init__(self, prior_s_per_char: float, smoothing: float) -> None:
        self.prior = Rate(
            prior_s_per_char / DEFAULT_AUDIO_S_PER_CHAR, DEFAULT_AUDIO_S_PER_CHAR, prior_s_per_char
        )
        self.smoothing = smoothing
        self.rates: dict[str, Rate] = {}
        self._warm: set[str] = set()  # keys whose first (set-up) call was seen

    def of(self, key: str) -> Rate:
        rate = self.rates.get(key)
        if rate is not None:
            return rate
        if self.rates:
            known = list(self.rates.values())
            return Rate(
                sum(r.compute_per_audio_s for r in known) / len(known),
                sum(r.audio_s_per_char for r in known) / len(known),
                sum(r.first_s_per_char for r in known) / len(known),
            )
        return self.prior

    def _rate(self, key: str) -> Rate:
        rate = self.rates.get(key)
        if rate is None:
            prior = self.of(key)
            rate = self.rates[key] = Rate(
                prior.compute_per_audio_s, prior.audio_s_per_char, prior.first_s_per_char
            )
        return rate

    def observe_call(self, key: str, compute_s: float, audio_s: float) -> None:
        """One engine call took `compute_s` and made `audio_s` of audio. A key's first call
        is not counted (an engine's first inference pays one-time set-up); the next sets the
        rate, and later ones move it by `smoothing`."""
        if compute_s <= 0 or audio_s <= 0:
            return
        if key not in self._warm:
            self._warm.add(key)
            return
        rate = self._rate(key)
        weight = self.smoothing if rate.calls else 1.0
        rate.compute_per_audio_s += (compute_s / audio_s - rate.compute_per_audio_s) * weight
        rate.calls += 1

    def _first_call(self, key: str) -> bool:
        """Whether the call just seen was the key's set-up call (observe_call, which runs
        first, counted none yet)."""
        rate = self.rates.get(key)
        return rate is None or rate.calls == 0

    def observe_first(self, key: str, compute_s: float, first_chars: int) -> None:
        """A synthesis's first engine call took `compute_s` for a first clause of
        `first_chars` characters."""
        if compute_s <= 0 or first_chars <= 0 or self._first_call(key):
            return
        rate = self._rate(key)
        weight = self.smoothing if rate.firsts else 1.0
        rate.first_s_per_char += (compute_s / first_chars - rate.first_s_per_char) * weight
        rate.firsts += 1

    def observe_text(self, key: str, chars: int, audio_s: float) -> None:
        """A finished synthesis of `chars` characters made `audio_s` of audio."""
        if chars <= 0 or audio_s <= 0:
            return
        rate = self._rate(key)
        weight = self.smoothing if rate.texts else 1.0
        rate.audio_s_per_char += (audio_s / chars - rate.audio_s_per_char) * weight
        rate.texts += 1


@dataclass(eq=False)
class Ticket:
    """One synthesis in progress, as the predictor sees it."""

    key: str  # engine/voice
    chars: int
    first_chars: int
    bulk: bool
    arrived: float
    first_done: bool = False
    call_started: float | None = None  # when the engine call in progress began (worker)
    call_cost_s: float = 0.0  # its predicted cost
    spent_s: float = 0.0  # the last engine call's seconds (written by the worker)
    playback_start: float = 0.0  # when the first chunk was ready
    audio_s: float = 0.0  # audio made so far
    chars_done: float = 0.0  # characters made so far (estimated from the audio)
    first_audio_at: float | None = None  # when its first audio was predicted, at admission
    closed: bool = field(default=False)


@dataclass(frozen=True, slots=True)
class Prediction:
    wait_s: float  # until the first clause starts
    first_audio_s: float  # until its first chunk is ready (wait + its own cost)
    budget_s: float  # its class's budget
    behind_s: float = 0.0  # how far the engine would fall behind admitted playback (> 0: pauses)

    @property
    def late_s(self) -> float:
        return self.first_audio_s - self.budget_s

    @property
    def fits(self) -> bool:
        """First audio within budget, or nothing ahead of it: refusing a request that would
        start at once spares nobody (an engine slower than the budget is the budget's
        problem), and admitted requests are what keeps the measured rate fresh; and no
        admitted stream made to pause (`behind_s`, one-shot requests only)."""
        on_time = self.first_audio_s <= self.budget_s or self.wait_s <= 0.0
        return on_time and self.behind_s <= 0.0

    def retry_after_s(self) -> int:
        """Whole seconds until the work ahead has drained enough for this to fit."""
        return max(1, math.ceil(max(self.late_s, self.behind_s)))


@dataclass(frozen=True, slots=True)
class _Demand:
    """One stream's engine work as a function of the time T it is due by: `step_s` due at
    `step_at` (a first clause, or the rest of a call running now), then `ramp_s` in all at
    `slope` engine seconds per second from `ramp_from` (its playback, a clause ahead)."""

    step_at: float
    step_s: float
    ramp_from: float = 0.0
    slope: float = 0.0
    ramp_s: float = 0.0


def overrun_s(demands: list[_Demand], now: float, slots: float, since: float) -> float:
    """The most engine seconds due by any moment T >= `since` beyond what `slots` slots
    do from `now` until T, over the slots: how far behind the engine would be at its worst
    (<= 0: never). The balance is piecewise linear in T, so its peaks are where a step
    lands or a ramp ends (and `since` itself); one sort and one sweep."""
    events: list[tuple[float, float, float]] = [(since, 0.0, 0.0)]
    for d in demands:
        if d.step_s > 0:
            events.append((d.step_at, d.step_s, 0.0))
        if d.ramp_s > 0 and d.slope > 0:
            events.append((d.ramp_from, 0.0, d.slope))
            events.append((d.ramp_from + d.ramp_s / d.slope, 0.0, -d.slope))
    events.sort()
    at, due, slope = events[0][0], 0.0, 0.0
    worst = -math.inf
    for when, step, dslope in events:
        due += slope * (when - at)
        at = when
        due += step
        slope += dslope
        if when >= since:
            worst = max(worst, due - slots * (when - now))
    return worst / max(1.0, slots)


class TtsSchedule:
    """The syntheses in progress and the prediction for a new one (module docstring)."""

    def __init__(
        self,
        budget_s: float,
        rates: ServiceRates,
        clock: Callable[[], float] = time.monotonic,
        one_shot_budget_s: float | None = None,
        *,
        continuity: bool = True,
    ) -> None:
        self.budget_s = budget_s  # a live reply's first-audio budget
        self.one_shot_budget_s = budget_s if one_shot_budget_s is None else one_shot_budget_s
        self.continuity = continuity  # one-shot requests are refused when others would pause
        self.rates = rates
        self.clock = clock
        self.tickets: set[Ticket] = set()
        self.last_wait_s = 0.0  # the latest prediction's wait (a gauge)
        self._share = CONTINUITY_SHARE  # the playback share as last cut (`playback_share`)
        self._cut_at = -math.inf  # when it was (it has recovered since)
        self.starved = 0  # one-shot streams whose chunk came after their audio ran out

    def fresh(self) -> TtsSchedule:
        """A schedule set up as this one, with its measured rates but nothing it learned
        since (the playback share, the counts): what a new server would admit with."""
        return TtsSchedule(
            self.budget_s,
            self.rates,
            self.clock,
            self.one_shot_budget_s,
            continuity=self.continuity,
        )

    def playback_share(self, now: float | None = None) -> float:
        """The share of the slots admitted playback may take now (CONTINUITY_SHARE's
        comment): the last cut, recovered since."""
        now = self.clock() if now is None else now
        recovered = self._share + (now - self._cut_at) * SHARE_RECOVERY_PER_S
        return min(CONTINUITY_SHARE, recovered)

    def _starving(self, now: float) -> None:
        """An admitted one-shot stream ran dry: admission let in more than kept playing."""
        self.starved += 1
        if now - self._cut_at < SHARE_CUT_SPACING_S:
            return
        self._share = max(SHARE_MIN, self.playback_share(now) * SHARE_CUT)
        self._cut_at = now

    @property
    def active(self) -> int:
        return len(self.tickets)

    @property
    def ms_per_char(self) -> dict[str, float]:
        return {key: r.compute_s_per_char * 1000 for key, r in self.rates.rates.items()}

    def untracked(self) -> Ticket:
        """A ticket nobody waits on (prewarm, the fallback phrase): only its calls' times
        are read, to measure the service rate; it is never ahead of anyone."""
        return Ticket("", 0, 0, True, self.clock(), closed=True)

    def open(self, key: str, text: str, *, bulk: bool) -> Ticket:
        ticket = Ticket(key, len(text), first_clause_chars(text), bulk, self.clock())
        self.tickets.add(ticket)
        return ticket

    def close(self, ticket: Ticket) -> None:
        """The synthesis ended (done, failed or abandoned); a complete one feeds the rate."""
        if ticket.closed:
            return
        ticket.closed = True
        self.tickets.discard(ticket)

    def finished(self, ticket: Ticket) -> None:
        """The engine said all of the text: its audio per character feeds the rate."""
        self.rates.observe_text(ticket.key, ticket.chars, ticket.audio_s)
        self.close(ticket)

    def call_cost(self, ticket: Ticket) -> None:
        """Before the ticket's next engine call: what it will cost (the worker then sets
        `call_started` when it begins: from then on only its rest is ahead of others)."""
        rate = self.rates.of(ticket.key)
        if ticket.first_done:
            ticket.call_cost_s = self._clause_chars(ticket) * rate.compute_s_per_char
        else:
            ticket.call_cost_s = ticket.first_chars * rate.first_s_per_char

    def call_done(self, ticket: Ticket, compute_s: float, audio_s: float) -> None:
        """An engine call of `compute_s` made `audio_s` of audio (0: the end); it feeds the
        rate."""
        now = self.clock()
        self.rates.observe_call(ticket.key, compute_s, audio_s)
        if not ticket.first_done:
            self.rates.observe_first(ticket.key, compute_s, ticket.first_chars)
        ticket.call_started = None
        if audio_s > 0:
            if not ticket.first_done:
                ticket.first_done = True
                ticket.playback_start = now
            elif ticket.bulk and now - (ticket.playback_start + ticket.audio_s) > STARVED_S:
                self._starving(now)
            ticket.audio_s += audio_s
            apc = self.rates.of(ticket.key).audio_s_per_char
            ticket.chars_done = min(ticket.chars, ticket.audio_s / apc if apc > 0 else 0.0)

    def budget_for(self, ticket: Ticket) -> float:
        """The first-audio budget of the ticket's class (one-shot or live)."""
        return self.one_shot_budget_s if ticket.bulk else self.budget_s

    def predict(self, ticket: Ticket, slots: int, *, live_apart: bool = False) -> Prediction:
        """When `ticket`'s (not yet started) first audio would come, given the tickets
        ahead of it and `slots` parallel calls for its class. `live_apart`: live work runs
        on slots a one-shot request cannot use (a stage that reserves them), so it is not
        ahead of one."""
        now = self.clock()
        budget = self.budget_for(ticket)
        deadline = ticket.arrived + budget
        ahead = 0.0
        for other in self.tickets:
            if other is ticket or (live_apart and ticket.bulk and not other.bulk):
                continue
            ahead += self._work_before(other, ticket.arrived, deadline, now)
        rate = self.rates.of(ticket.key)
        wait = ahead / max(1, slots)
        self.last_wait_s = wait
        own = ticket.first_chars * rate.first_s_per_char
        ticket.first_audio_at = now + wait + own
        behind = 0.0
        if self.continuity and ticket.bulk:
            behind = self.behind_s(ticket, slots, live_apart=live_apart)
        return Prediction(wait, (now - ticket.arrived) + wait + own, budget, behind)

    def behind_s(self, ticket: Ticket, slots: int, *, live_apart: bool = False) -> float:
        """How far behind the admitted streams' playback the engine would be at its worst,
        from `ticket`'s deadline on, were it admitted (module docstring); 0 when nothing
        else is in progress, or when one stream of its voice needs more than a slot (an
        engine slower than real time pauses alone; refusing others spares nobody)."""
        now = self.clock()
        others = [
            t
            for t in self.tickets
            if t is not ticket and not (live_apart and ticket.bulk and not t.bulk)
        ]
        if not others or self.rates.of(ticket.key).compute_per_audio_s >= 1.0:
            return 0.0
        share = self.playback_share(now)
        demands = [self._demand(t, now, share) for t in others]
        demands.append(self._demand(ticket, now, share))
        deadline = ticket.arrived + self.budget_for(ticket)
        return max(0.0, overrun_s(demands, now, slots, deadline))

    def _demand(self, ticket: Ticket, now: float, share: float) -> _Demand:
        """`ticket`'s engine work still to do, as a function of when it is due (its
        playback counted over `share`)."""
        rate = self.rates.of(ticket.key)
        step_at, step = now, 0.0
        if ticket.call_started is not None:  # its call in progress: its rest, due at its end
            step = max(0.0, ticket.call_cost_s - (now - ticket.call_started))
            step_at = now + step
        clause_s = self._clause_chars(ticket) * rate.audio_s_per_char
        if not ticket.first_done:
            plays = ticket.first_audio_at
            if plays is None:
                plays = ticket.arrived + self.budget_for(ticket)
            if ticket.call_started is None:
                step_at, step = plays, ticket.first_chars * rate.first_s_per_char
            left = float(ticket.chars - ticket.first_chars)
            ramp_from = plays  # its first clause's audio, less a clause ahead
        else:
            left = ticket.chars - ticket.chars_done
            if ticket.call_started is not None:
                left -= self._clause_chars(ticket)  # the call in progress makes it
            ramp_from = ticket.playback_start + ticket.audio_s - clause_s
        return _Demand(
            step_at,
            step,
            ramp_from,
            rate.compute_per_audio_s / share,
            max(0.0, left) * rate.compute_s_per_char / share,
        )

    def _work_before(self, other: Ticket, arrived: float, deadline: float, now: float) -> float:
        """Engine seconds of `other` that EDF serves before a first clause that arrived at
        `arrived` and is due at `deadline`."""
        work = 0.0
        if other.call_started is not None:
            work += max(0.0, other.call_cost_s - (now - other.call_started))
        rate = self.rates.of(other.key)
        if not other.first_done:
            if other.call_started is None and other.arrived <= arrived:
                work += other.first_chars * rate.first_s_per_char
            return work
        left = other.chars - other.chars_done
        if left <= 0 or rate.audio_s_per_char <= 0:
            return work
        runs_dry = other.playback_start + other.audio_s
        if runs_dry >= deadline:
            return work  # buffered past the deadline: its tail waits (first chunks first)
        # Audio it must make before `deadline` to play without a gap, in characters.
        need = (deadline - runs_dry) / rate.audio_s_per_char + self._clause_chars(other)
        return work + min(left, need) * rate.compute_s_per_char

    def _clause_chars(self, ticket: Ticket) -> float:
        """A later call's characters: a clause as long as the first, at most what is left."""
        return max(1.0, min(float(ticket.first_chars), ticket.chars - ticket.chars_done))

"""An engine's audio for one request, pulled a chunk per TTS-stage call: the deadlines each
chunk is due by (earliest-deadline-first, pipeline/scheduling/stage.py), the service rate each
call measures (tts_lateness.py), resampling to the output rate and adaptive chunks.

The engine's blocking generator is pulled one chunk per executor call, so other sessions'
first chunks interleave with a long reply, and a cancelled request stops between chunks: the
generator is closed on a worker thread once the piece in progress is done."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator

import numpy as np

from voxserve.audio.pcm import Int16Array
from voxserve.audio.resample import StreamResampler
from voxserve.engines.base import first_piece_choice
from voxserve.pipeline.context import SpeechContext
from voxserve.pipeline.scheduling.stage import (
    PRIORITY_BULK,
    PRIORITY_LIVE,
    EngineStage,
    deadline_in,
)
from voxserve.pipeline.scheduling.tts_lateness import Ticket, first_clause_chars
from voxserve.pipeline.synthesis.request import SpeechRequest, rate_key

POLITE_POLL_S = 0.05  # how often a prewarm waiting for a spare TTS slot looks again
# TTS stage deadlines (earliest-deadline-first, pipeline/scheduling/stage.py): a first chunk is
# awaited by a listener in silence; a later chunk is due when the audio already made would have
# played out, less a margin and less what the previous chunk took to come (a chunk must
# *finish* before playback runs dry, not start), so a stream about to run dry overtakes one
# far ahead. After a one-shot request's first chunk that lead is the chunk's engine time, not
# its wait: the wait was its queueing for admission (up to the one-shot budget under
# overload), and subtracted it made every tail due before its own listener began to play, so
# the tails of requests admitted earlier overtook the first chunks the admission rule
# (tts_lateness.py) had counted on: admitted requests came 1-2.4 s past their budget at 2x
# and 4x capacity. A live reply keeps the whole wait as its lead: its first chunk waits at
# most its 0.8 s budget at live priority, so what the predictor misses there is small, and
# a conversation's reply is the one that must not pause. (8 assistant streams on real
# engines, 2 vCPUs: a reply pause of 30-320 ms in some runs of every variant, the tree
# before included; too rare in 40 s runs to tell the variants apart.)
# A later chunk's lead is the larger of what the previous chunk took and this call's
# predicted cost (`TtsSchedule.call_cost`): piper's first piece is cut short ("Good morning,"
# is made in half the time of "the weather today is mild."), so the previous chunk's time
# alone let the second one start too late to be done before the first had played.
# A one-shot request's first chunk is due when admission predicted it would start
# (`Ticket.first_audio_at`, less its own cost), not FIRST_CHUNK_DUE_S after it asked:
# under overload that is seconds away, and a first chunk due at once, queued behind seconds
# of other first chunks, outranked every admitted stream's next clause until that stream
# was as late as the queue was long (HTTP at 2x capacity: 146 of 153 admitted streams
# paused, longest pause P99 2.1 s, with admission by continuity already on). Unloaded the
# prediction is now, so first chunks still go first. (Due a grace of 1 s later, at most at
# its budget, the next clauses of playing streams went first more often, but first audio
# at 1x capacity rose from P99 0.42-0.79 s to 1.20-2.78 s, and the pauses it was to spare
# were too few on this VM to tell apart: docs/benchmarks.md, "TTS overload".)
FIRST_CHUNK_DUE_S = 0.2
PLAYOUT_MARGIN_S = 0.1
# A chunk due later than this waits outside a busy TTS stage (EDF on): the stage queue, and
# the `waiting` that TTS health and flow control read, then hold only work that is due.
QUEUE_HORIZON_S = 0.5


class LockedChunks:
    """An engine's chunk generator pulled on worker threads: `close()` waits for a
    `next()` still running on another thread (also used by the cluster's TTS replicas)."""

    def __init__(self, gen: Iterator[Int16Array]) -> None:
        self._gen = gen
        self._lock = threading.Lock()

    def next_chunk(self) -> Int16Array | None:
        with self._lock:
            return next(self._gen, None)

    def close(self) -> None:
        with self._lock:
            close = getattr(self._gen, "close", None)
            if callable(close):
                close()


async def _until_nearly_due(stage: EngineStage, due: float) -> None:
    """While the stage is busy, wait until `due` is QUEUE_HORIZON_S away: a reply far ahead
    of its playback would only sit in the queue, counted as load, behind work that is due."""
    while stage.edf and (stage.waiting or stage.running >= stage.concurrency):
        ahead = due - QUEUE_HORIZON_S - time.monotonic()
        if ahead <= 0:
            return
        await asyncio.sleep(min(ahead, POLITE_POLL_S))


async def engine_chunks(
    ctx: SpeechContext,
    request: SpeechRequest,
    before_chunk: Callable[[], Awaitable[None]] | None = None,
    *,
    bulk: bool = False,
    prewarm: bool = False,
    ticket: Ticket | None = None,
) -> AsyncGenerator[Int16Array, None]:
    """The engine's audio at the output rate, in adaptive chunks (request.chunker()).
    `bulk`: each chunk is a bulk call (pipeline/scheduling/stage.py); `prewarm`: due a whole stage
    timeout out, as nobody is listening. `ticket`: the admitted synthesis, told each call's
    engine time and audio (tts_lateness.py), closed at the end."""
    engine = request.engine
    stage = ctx.stages.stage("tts")
    priority = PRIORITY_BULK if bulk else PRIORITY_LIVE
    started = 0.0  # when the first chunk was ready: playback runs dry at started + made_s
    made_s = 0.0  # audio produced so far
    took = 0.0  # how long the last chunk took to come (queue + synthesis): the next's lead
    # (after a one-shot request's first chunk: its synthesis only, module comment)
    resampler = StreamResampler(engine.sample_rate, request.sample_rate)
    chunker = request.chunker()
    # A short first piece for a live reply only, where the engine offers the choice (why:
    # engines/base.py, short_first_piece).
    first = first_piece_choice(engine, short=not bulk)
    source = LockedChunks(
        engine.synthesize(request.text, voice=request.voice.id, speed=request.speed, **first)
    )
    schedule = ctx.speech.health.schedule
    key = rate_key(request)
    timing = ticket or schedule.untracked()  # every call measures the service rate
    pull = _timed_pull(source, timing, schedule.clock)
    complete = False
    try:
        while True:
            if before_chunk is not None:
                await before_chunk()
            if ticket is not None:
                schedule.call_cost(ticket)  # the call's predicted cost, before it is queued
            if prewarm:
                due = deadline_in(stage.timeout_s)
            elif made_s == 0.0:
                due = first_chunk_due(ticket, bulk)
            else:
                cost = ticket.call_cost_s if ticket is not None else 0.0
                due = later_chunk_due(started + made_s, took, cost)
                await _until_nearly_due(stage, due)
            asked = time.monotonic()
            chunk = await stage.run(pull, deadline=due, priority=priority)
            took = timing.spent_s if bulk and not made_s else time.monotonic() - asked
            audio_s = 0.0 if chunk is None else chunk.size / engine.sample_rate
            if ticket is None:
                schedule.rates.observe_call(key, timing.spent_s, audio_s)
                if made_s == 0.0 and audio_s > 0:
                    schedule.rates.observe_first(
                        key, timing.spent_s, first_clause_chars(request.text)
                    )
            else:
                schedule.call_done(ticket, ticket.spent_s, audio_s)
            if chunk is None:
                complete = True
                break
            if made_s == 0.0:
                started = time.monotonic()
            made_s += chunk.size / engine.sample_rate
            out = resampler.process(np.asarray(chunk, dtype=np.int16))
            for piece in chunker.split(out):
                yield piece
        for piece in chunker.split(resampler.flush()):
            yield piece
    finally:
        if ticket is not None:
            (schedule.finished if complete else schedule.close)(ticket)
        elif complete:
            schedule.rates.observe_text(key, len(request.text), made_s)
        # Closing waits for a chunk still being made, so do it on the executor.
        ctx.speech.executor.submit(source.close)


def later_chunk_due(runs_dry: float, took: float, cost_s: float) -> float:
    """A later chunk must be made before playback runs dry at `runs_dry`: it is due a margin
    and its lead before, the lead being the larger of what the last chunk took and this
    call's predicted cost `cost_s` (module comment)."""
    return runs_dry - PLAYOUT_MARGIN_S - max(took, cost_s)


def first_chunk_due(ticket: Ticket | None, bulk: bool) -> float:
    """A first chunk is due FIRST_CHUNK_DUE_S after it is asked for; a one-shot request's
    no sooner than when admission predicted it would start, less the call's predicted cost
    (`TtsSchedule.call_cost`, set before) (module comment)."""
    due = deadline_in(FIRST_CHUNK_DUE_S)
    if bulk and ticket is not None and ticket.first_audio_at is not None:
        due = max(due, ticket.first_audio_at - ticket.call_cost_s)
    return due


def _timed_pull(
    source: LockedChunks, ticket: Ticket, clock: Callable[[], float]
) -> Callable[[], Int16Array | None]:
    """`source.next_chunk`, telling the ticket when the engine call began and how long it
    took (plain float writes from the worker thread; the loop reads them)."""

    def pull() -> Int16Array | None:
        ticket.call_started = began = clock()
        try:
            return source.next_chunk()
        finally:
            ticket.spent_s = clock() - began

    return pull

"""Text to audio chunks: the one TTS path of every transport (WebSocket replies through
speaker.py, HTTP speech, gRPC, `voxserve say`).

A validated request is looked up in the TTS cache: a hit streams from memory, cut by the
same rule as a miss (pipeline/synthesis/chunking.py: a `tts.first_chunk_ms` first chunk, then chunks
growing with the audio sent, up to `tts.max_chunk_ms`). A miss joins the synthesis of that
text already in progress, or starts one (single flight, cache/flight.py), which is cached
once complete.
Text that needs a new synthesis is admitted by predicted lateness (tts_lateness.py): it
raises TtsDegraded before any audio, instead of queueing, only when its first audio would
miss its deadline (or TTS is degraded: tts_health.py); while the process is over its memory
threshold (memory_guard.py), it raises `overloaded`. An admitted synthesis holds a ticket
that tells the predictor what it has made, and its engine time measures the service rate.

Text is checked and cleaned once, here (`check_text`, voxserve/speakable.py), for every
transport: control characters become spaces, invisible ones go, and text with nothing to
say is `empty_text` before any engine sees it. Engines cut what they are given into pieces
of bounded work (voxserve/text.py MAX_PIECE_CHARS; engines/piper_tts.py).

The engine's blocking generator is pulled one chunk per executor call, so other sessions'
first chunks interleave with a long reply, and a cancelled request stops between chunks: a
stage timeout, a client gone or a cancel closes the generator once the piece in progress is
done (on a worker thread), and no further piece is synthesised.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import numpy as np

from voxserve.audio.pcm import Int16Array
from voxserve.audio.resample import StreamResampler, check_rate
from voxserve.cache.entry import Entry
from voxserve.cache.fingerprints import EngineFingerprints
from voxserve.cache.flight import Flight
from voxserve.cache.key import SHARED_SCOPE, CacheKey, canonical_text, make_key, round_speed
from voxserve.cache.tts_cache import TtsCache
from voxserve.engines.base import TtsEngine
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.context import SpeechContext
from voxserve.pipeline.scheduling.stage import (
    PRIORITY_BULK,
    PRIORITY_LIVE,
    EngineStage,
    deadline_in,
)
from voxserve.pipeline.scheduling.tts_health import TtsHealth
from voxserve.pipeline.scheduling.tts_lateness import Ticket, first_clause_chars
from voxserve.pipeline.streams import aclose
from voxserve.pipeline.synthesis.chunking import Chunker, chunk_sizes
from voxserve.speakable import clean_text, is_speakable
from voxserve.types import SUPPORTED_OUTPUT_RATES, Voice

MIN_SPEED = 0.25
MAX_SPEED = 4.0
POLITE_POLL_S = 0.05  # how often a prewarm waiting for a spare TTS slot looks again
# TTS stage deadlines (earliest-deadline-first, pipeline/scheduling/stage.py): a first chunk is
# awaited by a listener in silence; a later chunk is due when the audio already made would have
# played out, less a margin and less what the previous chunk took to come (a chunk must
# *finish* before playback runs dry, not start), so a stream about to run dry overtakes one
# far ahead.
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


def check_text(text: str, max_chars: int) -> str:
    """The text an engine will be given: stripped and cleaned (voxserve/speakable.py).
    Over `max_chars` is `text_too_long`; nothing to say is `empty_text`."""
    text = text.strip()
    if not text:
        raise VoxError(ErrorCode.EMPTY_TEXT, "text to synthesise is empty")
    if len(text) > max_chars:
        raise VoxError(
            ErrorCode.TEXT_TOO_LONG, f"text has {len(text)} characters; the limit is {max_chars}"
        )
    text = clean_text(text).strip()
    if not is_speakable(text):
        raise VoxError(
            ErrorCode.EMPTY_TEXT,
            "text has nothing to speak: only punctuation, white space or invisible characters",
        )
    return text


async def first_audio(chunks: AsyncIterator[Int16Array]) -> Int16Array:
    """The first chunk of a one-shot synthesis (HTTP, gRPC, Wyoming), awaited before any
    answer is sent: a text the voice made no audio of at all is `empty_text` (a symbol
    the voice says nothing for). Closes `chunks` when it raises."""
    try:
        first = await anext(chunks, None)
        if first is None:
            raise VoxError(ErrorCode.EMPTY_TEXT, "the voice has nothing to say for this text")
    except BaseException:
        await aclose(chunks)
        raise
    return first


def check_speed(speed: float) -> float:
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            f"speed {speed:g} is out of range; use {MIN_SPEED:g} to {MAX_SPEED:g}",
        )
    return speed


@dataclass(frozen=True, slots=True)
class SpeechRequest:
    """A validated synthesis: what to say, with which engine, in what chunks."""

    text: str
    voice: Voice
    engine: TtsEngine
    speed: float  # rounded to 0.01, as in the cache key
    sample_rate: int
    max_samples: int  # per chunk: tts.max_chunk_ms at sample_rate
    first_samples: int  # the first chunk: tts.first_chunk_ms at sample_rate

    def chunker(self) -> Chunker:
        return Chunker(self.first_samples, self.max_samples)


def plan(
    ctx: SpeechContext, text: str, voice: str | None, speed: float, sample_rate: int | None
) -> SpeechRequest:
    settings = ctx.settings
    out_rate = check_rate(sample_rate or settings.tts.output_sample_rate, SUPPORTED_OUTPUT_RATES)
    # The engine is given the text's canonical (NFC) form, the one its cache key names.
    text = canonical_text(check_text(text, settings.limits.max_text_chars))
    check_speed(speed)
    voice_info, engine = ctx.engines.voice(voice)
    first_samples, max_samples = chunk_sizes(settings.tts, out_rate)
    return SpeechRequest(
        text, voice_info, engine, round_speed(speed), out_rate, max_samples, first_samples
    )


def cache_key(
    fingerprints: EngineFingerprints, request: SpeechRequest, scope: str = SHARED_SCOPE
) -> CacheKey:
    return make_key(
        request.text,
        voice=request.voice.id,
        speed=request.speed,
        sample_rate=request.sample_rate,
        engine=fingerprints.of(request.engine),
        scope=scope,
    )


def _lookup(
    cache: TtsCache, fingerprints: EngineFingerprints, request: SpeechRequest, key: CacheKey
) -> Entry | None:
    """The entry of `key`; for a key's own scope, else the shared one (prewarmed phrases)."""
    entry = cache.lookup(key)
    if entry is None and key.scope != SHARED_SCOPE:
        entry = cache.lookup(cache_key(fingerprints, request))
    return entry


async def synthesize(
    ctx: SpeechContext,
    text: str,
    *,
    voice: str | None = None,
    speed: float = 1.0,
    sample_rate: int | None = None,
    bulk: bool = False,
    scope: str = SHARED_SCOPE,
) -> AsyncGenerator[Int16Array, None]:
    """Yield int16 chunks (adaptive: pipeline/synthesis/chunking.py) at `sample_rate` as they are
    made (or at once, from the cache). Raises TtsDegraded, before any chunk, for uncached text
    while TTS is degraded. `bulk`: a one-shot request (HTTP, gRPC Synthesize, Wyoming), not
    a live session's reply: its chunks are bulk calls on the TTS stage
    (pipeline/scheduling/stage.py). `scope`: whose cache entries may answer and where a miss is
    stored (cache/key.py; the transports derive it from the caller's API key)."""
    request = plan(ctx, text, voice, speed, sample_rate)
    started = time.perf_counter()
    work_class = "bulk" if bulk else "live"
    cache = ctx.speech.cache
    chunks: AsyncGenerator[Int16Array, None]
    if cache is None:
        ticket = _admit_miss(ctx, request, bulk)
        source = "miss"
        chunks = _observed(
            ctx.speech.health, _engine_chunks(ctx, request, bulk=bulk, ticket=ticket), bulk
        )
    else:
        fingerprints = ctx.speech.fingerprints
        key = cache_key(fingerprints, request, scope)
        entry = _lookup(cache, fingerprints, request, key)
        if entry is not None:
            ctx.metrics.observe_first_audio("hit", time.perf_counter() - started, work_class)
            for piece in request.chunker().split(entry.samples()):
                yield piece
            return
        flight = cache.flights.get(key)
        if flight is None:
            ticket = _admit_miss(ctx, request, bulk)
            cache.misses += 1
            source = "miss"
            flight = cache.flights.start(
                key,
                _producer(ctx, request, ticket, bulk),
                lambda done: _store(cache, done),
                max_bytes=ctx.settings.cache.max_entry_bytes,
            )
        else:
            cache.coalesced += 1
            source = "joined"
        chunks = flight.join()
    async with contextlib.aclosing(chunks):
        first = True
        async for piece in chunks:
            if first:
                ctx.metrics.observe_first_audio(source, time.perf_counter() - started, work_class)
                first = False
            yield piece


async def synthesize_all(
    ctx: SpeechContext,
    text: str,
    *,
    voice: str | None = None,
    speed: float = 1.0,
    sample_rate: int | None = None,
) -> Int16Array:
    chunks = [
        chunk
        async for chunk in synthesize(ctx, text, voice=voice, speed=speed, sample_rate=sample_rate)
    ]
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)


async def cache_speech(
    ctx: SpeechContext,
    text: str,
    *,
    voice: str | None = None,
    speed: float = 1.0,
    sample_rate: int | None = None,
    polite: bool = False,
) -> tuple[Int16Array, bool]:
    """Make sure a reply is cached, for prewarming and the fallback phrase (not live
    traffic: no degradation check, no latency accounting, no hit counted). Returns its audio
    and whether it had to be synthesised. `polite`: take a TTS slot only when the stage has
    one to spare, so live requests never wait behind this."""
    request = plan(ctx, text, voice, speed, sample_rate)
    cache = ctx.speech.cache
    key = cache_key(ctx.speech.fingerprints, request) if cache is not None else None
    if cache is not None and key is not None:
        entry = cache.lru.get(key.digest)
        if entry is not None and entry.expires > cache.clock():
            return entry.samples(), False
    stage = ctx.stages.stage("tts")
    before = (lambda: _spare_slot(stage)) if polite else None
    pieces_of = _engine_chunks(ctx, request, before, bulk=polite, prewarm=polite)
    async with contextlib.aclosing(pieces_of) as chunks:
        pieces = [piece async for piece in chunks]
    samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int16)
    if cache is not None and key is not None:
        cache.store(key, samples.astype("<i2", copy=False).tobytes())
    return samples, True


async def _until_nearly_due(stage: EngineStage, due: float) -> None:
    """While the stage is busy, wait until `due` is QUEUE_HORIZON_S away: a reply far ahead
    of its playback would only sit in the queue, counted as load, behind work that is due."""
    while stage.edf and (stage.waiting or stage.running >= stage.concurrency):
        ahead = due - QUEUE_HORIZON_S - time.monotonic()
        if ahead <= 0:
            return
        await asyncio.sleep(min(ahead, POLITE_POLL_S))


async def _spare_slot(stage: EngineStage) -> None:
    """Wait until nobody queues for the stage and a slot would be left for a live arrival.
    Polled: the stage has no idle event, and 20 looks a second while busy cost nothing."""
    while stage.waiting or stage.running >= max(1, stage.concurrency - 1):  # noqa: ASYNC110
        await asyncio.sleep(POLITE_POLL_S)


def _store(cache: TtsCache, flight: Flight) -> None:
    if flight.nbytes:  # no audio (a text the voice says nothing for) is not a reply
        cache.store(flight.key, flight.pcm())


def rate_key(request: SpeechRequest) -> str:
    """Whose service rate a synthesis measures and is predicted by: engine/voice."""
    return f"{request.engine.info.name}/{request.voice.id}"


def _admit_miss(ctx: SpeechContext, request: SpeechRequest, bulk: bool) -> Ticket:
    """A synthesis that needs the engine: its ticket, or TtsDegraded when its first audio
    is predicted late (over the slots the stage gives its class: every one on the
    work-conserving TTS stage, pipeline/scheduling/stage.py) or
    TTS is degraded (the backstop queue judged by live work only for a live reply, by the
    whole queue for bulk), or `overloaded` over the memory threshold."""
    stage = ctx.stages.stage("tts")
    health = ctx.speech.health
    ticket = health.schedule.open(rate_key(request), request.text, bulk=bulk)
    prediction = health.admit(
        ticket,
        stage.waiting if bulk else stage.live_waiting,
        stage.slots_for(bulk),
        live_apart=not stage.work_conserving,
    )
    ctx.metrics.observe_tts_prediction(prediction.wait_s, prediction.first_audio_s)
    try:
        ctx.speech.memory_guard.check("synthesis", fatal=False)
    except BaseException:
        health.schedule.close(ticket)
        raise
    return ticket


def _producer(
    ctx: SpeechContext, request: SpeechRequest, ticket: Ticket, bulk: bool = False
) -> Callable[[Flight], Awaitable[None]]:
    """The task body of a miss's flight: engine chunks into the flight."""

    async def produce(flight: Flight) -> None:
        chunks = _observed(
            ctx.speech.health, _engine_chunks(ctx, request, bulk=bulk, ticket=ticket), bulk
        )
        async with contextlib.aclosing(chunks) as it:
            async for piece in it:
                await flight.push(piece)

    return produce


async def _observed(
    health: TtsHealth, chunks: AsyncGenerator[Int16Array, None], one_shot: bool
) -> AsyncGenerator[Int16Array, None]:
    """Pass chunks through, telling TTS health how long a miss waited for its first."""
    started = time.perf_counter()
    first = True
    async with contextlib.aclosing(chunks):
        async for piece in chunks:
            if first:
                health.observe_first_audio(time.perf_counter() - started, one_shot=one_shot)
                first = False
            yield piece


async def _engine_chunks(
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
    resampler = StreamResampler(engine.sample_rate, request.sample_rate)
    chunker = request.chunker()
    source = LockedChunks(
        engine.synthesize(request.text, voice=request.voice.id, speed=request.speed)
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
            if prewarm:
                due = deadline_in(stage.timeout_s)
            elif made_s == 0.0:
                due = deadline_in(FIRST_CHUNK_DUE_S)
            else:
                due = started + made_s - PLAYOUT_MARGIN_S - took
                await _until_nearly_due(stage, due)
            asked = time.monotonic()
            if ticket is not None:
                schedule.call_cost(ticket)
            chunk = await stage.run(pull, deadline=due, priority=priority)
            took = time.monotonic() - asked
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

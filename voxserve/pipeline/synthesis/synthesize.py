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

Text is checked and cleaned once (request.py `check_text`, voxserve/speakable.py), for every
transport: control characters become spaces, invisible ones go, and text with nothing to
say is `empty_text` before any engine sees it. Engines cut what they are given into pieces
of bounded work (voxserve/text.py MAX_PIECE_CHARS; engines/piper_tts.py).

The request's checks are request.py's; the engine's chunks, their deadlines and the service
rate they measure are engine_chunks.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

import numpy as np

from voxserve.audio.pcm import Int16Array
from voxserve.cache.entry import Entry
from voxserve.cache.fingerprints import EngineFingerprints
from voxserve.cache.flight import Flight
from voxserve.cache.key import SHARED_SCOPE, CacheKey
from voxserve.cache.tts_cache import TtsCache
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.context import SpeechContext
from voxserve.pipeline.scheduling.stage import (
    EngineStage,
)
from voxserve.pipeline.scheduling.tts_health import TtsHealth
from voxserve.pipeline.scheduling.tts_lateness import Ticket
from voxserve.pipeline.streams import aclose
from voxserve.pipeline.synthesis.engine_chunks import POLITE_POLL_S, engine_chunks
from voxserve.pipeline.synthesis.request import SpeechRequest, cache_key, plan, rate_key


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
            ctx.speech.health, engine_chunks(ctx, request, bulk=bulk, ticket=ticket), bulk
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
    pieces_of = engine_chunks(ctx, request, before, bulk=polite, prewarm=polite)
    async with contextlib.aclosing(pieces_of) as chunks:
        pieces = [piece async for piece in chunks]
    samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int16)
    if cache is not None and key is not None:
        cache.store(key, samples.astype("<i2", copy=False).tobytes())
    return samples, True


async def _spare_slot(stage: EngineStage) -> None:
    """Wait until nobody queues for the stage and a slot would be left for a live arrival.
    Polled: the stage has no idle event, and 20 looks a second while busy cost nothing."""
    while stage.waiting or stage.running >= max(1, stage.concurrency - 1):  # noqa: ASYNC110
        await asyncio.sleep(POLITE_POLL_S)


def _store(cache: TtsCache, flight: Flight) -> None:
    if flight.nbytes:  # no audio (a text the voice says nothing for) is not a reply
        cache.store(flight.key, flight.pcm())


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
            ctx.speech.health, engine_chunks(ctx, request, bulk=bulk, ticket=ticket), bulk
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

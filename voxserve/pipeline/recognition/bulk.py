"""Whole-buffer recognition (uploads, Wyoming, `voxserve transcribe`) through the shared ASR
stage, as bulk work, in batches shared with every other upload.

A recording longer than one window (`asr.bulk_window_s`) goes through the VAD engine first
(pipeline/recognition/upload_vad.py, bulk calls on the VAD stage); its speech regions are packed
into windows of at most `asr.bulk_window_s` of audio, the silence between regions skipped
(pipeline/recognition/speech_windows.py). Every window goes to the cross-session ASR batcher as a
bulk request (pipeline/scheduling/asr_batch.py): the windows of one recording and those of
concurrent uploads are decoded together in engine batches, each segment's times are then put back on
the recording's time line. Bulk holds at most `pipeline.asr.bulk_slots` slots and one bulk
batch at most `asr.bulk_batch_s` of audio, so live finals always find a slot and never wait
in the engine behind more than one bounded batch (pipeline/scheduling/batcher.py,
pipeline/scheduling/stage.py). With `pipeline.asr_batch_enabled` off, each window is one bulk call
on the stage instead. A request's `options` (prompt, temperature, word timestamps, task) go with
each of its windows; a batch holds windows with equal options only. Word times are moved with their
segments. A segment Whisper did not break where two pieces of a window meet covers both
(its start in the first, its end in the second), as in faster-whisper's batched pipeline.

Time: the request is promised its transcript within `asr.one_shot_budget_ms` plus
`asr.one_shot_budget_per_audio` x its audio (a long upload is not late for being long).
Window k is due, for the earliest-deadline-first order of bulk batches and of the stage,
when that promise spread over the audio says (start + the promise for the audio up to the
window's end): a short upload arriving behind long ones is due before their later windows,
so it runs next rather than after them, and uploads interleave. Admission is a
schedulability test (`admit_one_shot`, Batcher.bulk_outlook): one that would be late, or
would make admitted work late, is refused at once (`overloaded`, Retry-After: how late)
instead of answering late. The stage timeout plus the audio's length is the hard limit.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from functools import partial
from typing import Any, Protocol, TypeVar, cast

import numpy as np

from voxserve.audio.pcm import Float32Array, Int16Array, to_float32
from voxserve.audio.resample import resample
from voxserve.config import Settings
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.context import EngineContext
from voxserve.pipeline.generations import Generation, Lease
from voxserve.pipeline.recognition.speech_windows import (
    MIN_SILENCE_S,
    PAD_S,
    SpeechWindow,
    pack_windows,
    speech_regions,
)
from voxserve.pipeline.recognition.upload_vad import speech_probs
from voxserve.pipeline.recognition.word_times import Span, clip_to_speech
from voxserve.pipeline.scheduling.asr_batch import AsrBatcher, float_audio
from voxserve.pipeline.scheduling.batcher import BulkReservation
from voxserve.pipeline.scheduling.stage import PRIORITY_BULK, EngineStage
from voxserve.pipeline.scheduling.work_pools import WorkPool
from voxserve.types import SAMPLE_RATE, AsrOptions, AsrResult, Segment

Recording = Float32Array | Int16Array  # 16 kHz; an upload is held as int16 (half the bytes)
HEAD_S = 60.0  # a long recording's first minute is windowed first (`_window_groups`)
T = TypeVar("T")
MIN_FILE_RATE = 4_000
MAX_FILE_RATE = 192_000


class RecognitionContext(EngineContext, Protocol):
    """What recognition reads: the stages and settings, and a hold on the current engines
    (and their batchers) for the length of one recording."""

    def lease(self) -> Lease: ...


async def transcribe(
    ctx: RecognitionContext, samples: Recording, sample_rate: int, *, language: str | None = None
) -> AsrResult:
    """A whole recording's result at once, its windows' joined (Wyoming, `voxserve transcribe`:
    no options for the engine, the windows found on the event loop)."""
    windows = transcribe_windows(ctx, samples, sample_rate, language=language)
    return join_results([result async for result in windows])


async def transcribe_windows(
    ctx: RecognitionContext,
    samples: Int16Array | Float32Array,
    sample_rate: int,
    *,
    language: str | None = None,
    options: AsrOptions | None = None,
    pool: WorkPool | None = None,
) -> AsyncIterator[AsrResult]:
    """Each window's result in audio order as soon as it and those before it are decoded,
    its times (words too) on the recording's time line (module docstring). `options` go to
    every window's call; None asks nothing of the engine. `pool` (the decode pool) finds a
    long recording's windows off the event loop."""
    if not MIN_FILE_RATE <= sample_rate <= MAX_FILE_RATE:
        raise VoxError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"sample rate {sample_rate} is outside {MIN_FILE_RATE}-{MAX_FILE_RATE} Hz",
        )
    language = ctx.engines.check_language(language)
    if samples.size == 0:
        raise VoxError(ErrorCode.EMPTY_AUDIO, "no audio to transcribe")
    audio = _float_audio(samples, sample_rate)
    lease = ctx.lease()
    try:
        async for result in _recognise(ctx, lease.generation, audio, language, options, pool):
            yield result
    finally:
        lease.release()


def one_shot_budget_s(settings: Settings, audio_s: float) -> float:
    """How soon after its audio is in a one-shot transcript is promised (asr config)."""
    asr = settings.asr
    return asr.one_shot_budget_ms / 1000 + audio_s * asr.one_shot_budget_per_audio


def admit_one_shot(
    ctx: EngineContext,
    stage: EngineStage,
    batcher: AsrBatcher | None,
    audio_s: float,
    deadline: float,
) -> BulkReservation | None:
    """Refuse (`overloaded`, Retry-After: how late it would be) a recording whose transcript
    is predicted past its budget: the bulk work due before it, then its own windows, at the
    measured cost of bulk batches (module docstring). Nothing ahead of it: always taken.
    Admitted through the batcher: its windows are reserved there until submitted (the
    caller releases the reservation when it is done)."""
    windows = max(1, math.ceil(audio_s / ctx.settings.asr.bulk_window_s))
    if batcher is not None:
        outlook = batcher.bulk_outlook(deadline, windows, audio_s)
    else:
        outlook = stage.bulk_outlook(deadline, windows)
    predicted_s, budget_s = outlook.done_s, one_shot_budget_s(ctx.settings, audio_s)
    late_s = predicted_s - budget_s if outlook.ahead else 0.0  # alone: always taken
    if late_s <= 0 and outlook.harms_s <= 0:
        return batcher.reserve(windows, audio_s, deadline) if batcher is not None else None
    stage.refused_late += 1
    if late_s > 0:
        why = (
            f"this transcript would come {predicted_s:.1f} s after its audio, past its "
            f"budget of {budget_s:.1f} s (asr.one_shot_budget_ms)"
        )
    else:
        why = f"taking it would make admitted transcripts {outlook.harms_s * 1000:.0f} ms late"
    raise VoxError(
        ErrorCode.OVERLOADED,
        f"speech recognition is saturated: {why}; retry later",
        stage="asr",
        retry_after_s=max(1, math.ceil(max(late_s, outlook.harms_s))),
    )


def _float_audio(samples: Int16Array | Float32Array, sample_rate: int) -> Recording:
    """The recording at 16 kHz; one there already (an upload, int16, decoded in its pool)
    is used as it is: no copy of hours of audio made on the event loop. Each window
    becomes float32 where an engine reads it (asr_batch.float_audio, upload_vad)."""
    if sample_rate == SAMPLE_RATE and samples.dtype in (np.float32, np.int16):
        return samples
    return to_float32(resample(cast(Int16Array, samples), sample_rate, SAMPLE_RATE))


async def _recognise(
    ctx: EngineContext,
    generation: Generation,
    audio: Recording,
    language: str | None,
    options: AsrOptions | None,
    pool: WorkPool | None,
) -> AsyncIterator[AsrResult]:
    stage = ctx.stages.stage("asr")
    batcher = generation.asr_batcher()
    limit_s = stage.timeout_s + audio.size / SAMPLE_RATE  # the hard limit, not the promise
    began = time.monotonic()
    expires = began + limit_s

    def due(end: int) -> float:
        """A window's deadline: the request's promise for the audio up to its end."""
        return began + one_shot_budget_s(ctx.settings, end / SAMPLE_RATE)

    reservation = admit_one_shot(ctx, stage, batcher, audio.size / SAMPLE_RATE, due(audio.size))
    # only when asked: an engine written before `options` still serves plain uploads
    extra: dict[str, Any] = {"options": options} if options is not None else {}
    # Word times are clipped to the VAD's speech (word_times.py), found beside the decodes.
    spans: asyncio.Future[list[Span]] | None = None
    if options is not None and options.word_timestamps:
        spans = asyncio.ensure_future(_speech_spans(ctx, generation, audio, expires, pool))

    async def decode(window: SpeechWindow) -> AsrResult:
        clip = window.audio(audio)
        if batcher is not None:
            return await batcher.bulk(
                clip,
                language,
                options,
                deadline=due(window.end),
                expires=expires,
                reservation=reservation,
            )
        asr = generation.engines.asr
        result: AsrResult = await stage.run(
            lambda: asr.transcribe(float_audio(clip), language=language, **extra),
            timeout_s=max(0.0, expires - time.monotonic()),
            deadline=due(window.end),
            priority=PRIORITY_BULK,
        )
        return result

    # Batched: every window is handed to the batcher as soon as the VAD has found it (they
    # share batches, and the head's windows decode while the VAD reads the rest);
    # otherwise one at a time, so the upload queues again between windows.
    windows: list[SpeechWindow] = []
    tasks: list[asyncio.Future[AsrResult]] = []
    try:
        async for group in _window_groups(ctx, generation, audio, expires, pool):
            windows += group
            if batcher is not None:
                tasks += [asyncio.ensure_future(decode(window)) for window in group]
        for index, window in enumerate(windows):
            try:
                async with asyncio.timeout(max(0.0, expires - time.monotonic())):
                    result = await (tasks[index] if tasks else decode(window))
            except TimeoutError:
                raise VoxError(
                    ErrorCode.STAGE_TIMEOUT, f"asr did not answer within {limit_s:g} s", stage="asr"
                ) from None
            timed = on_recording(window, result)
            yield timed if spans is None else clip_to_speech(timed, await spans)
    finally:
        if batcher is not None and reservation is not None:
            batcher.release(reservation)
        for task in tasks:
            task.cancel()
        if spans is not None:
            spans.cancel()


async def _speech_spans(
    ctx: EngineContext,
    generation: Generation,
    audio: Recording,
    expires: float,
    pool: WorkPool | None,
) -> list[Span]:
    """The recording's speech as the VAD hears it, unpadded, in ms (word_times.py)."""
    vad = generation.engines.vad
    width = vad.window_samples
    cfg = ctx.settings.vad
    probs = await speech_probs(vad, ctx.stages.stage("vad"), audio, expires=expires)
    find = partial(
        speech_regions,
        probs,
        width,
        int(audio.size),
        threshold=cfg.threshold,
        neg_threshold=cfg.neg_threshold,
        pad_s=0.0,
    )
    regions = find() if pool is None else await pool.run(find)
    return [(max(0, a - width) * 1000 // SAMPLE_RATE, b * 1000 // SAMPLE_RATE) for a, b in regions]


async def _window_groups(
    ctx: EngineContext,
    generation: Generation,
    audio: Recording,
    expires: float,
    pool: WorkPool | None,
) -> AsyncIterator[list[SpeechWindow]]:
    """The recording's windows, a group at a time: the whole recording if it fits one
    window; else its speech packed into windows, the first HEAD_S first (a speech region
    still open at the head's end is judged again with the rest), so that Whisper has work
    while the VAD reads the rest."""
    max_s = ctx.settings.asr.bulk_window_s
    if audio.size <= max_s * SAMPLE_RATE:
        yield [SpeechWindow(((0, int(audio.size)),))]
        return
    vad = generation.engines.vad
    width = vad.window_samples
    cfg = ctx.settings.vad

    async def regions_of(start: int, end: int) -> list[tuple[int, int]]:
        probs = await speech_probs(vad, ctx.stages.stage("vad"), audio[start:end], expires=expires)
        found = await off_loop(
            speech_regions,
            probs,
            width,
            end - start,
            threshold=cfg.threshold,
            neg_threshold=cfg.neg_threshold,
        )
        return [(a + start, b + start) for a, b in found]

    async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Work over the whole recording (its regions, the energy that cuts long ones) in
        `pool` when there is one: on the loop it stalled live streams for an hour's upload."""
        if pool is None:
            return fn(*args, **kwargs)
        return await pool.run(partial(fn, *args, **kwargs))

    start = 0
    head = int(HEAD_S * SAMPLE_RATE) // width * width
    if audio.size > 2 * head:
        regions = await regions_of(0, head)
        start = head
        if regions and regions[-1][1] >= head - int((MIN_SILENCE_S + PAD_S) * SAMPLE_RATE):
            start = regions.pop()[0] // width * width  # may go on past the head
        yield await off_loop(pack_windows, audio, regions, max_s)
    rest = await regions_of(start, int(audio.size))
    yield await off_loop(pack_windows, audio, rest, max_s)


def on_recording(window: SpeechWindow, result: AsrResult) -> AsrResult:
    """A window's result with its segments (and their words) on the recording's time line;
    a window with text but no segments becomes one segment over the whole window."""
    text = result.text.strip()
    if window.pieces[0][0] == 0 and len(window.pieces) == 1 and (result.segments or not text):
        return result
    if not text:
        return AsrResult(text="", language=result.language)
    own = result.segments or (Segment(text, 0, window.size * 1000 // SAMPLE_RATE),)
    segments = []
    for segment in own:
        start = window.to_recording_ms(segment.start_ms)
        end = max(start, window.to_recording_ms(segment.end_ms, closing=True))
        words = []
        for word in segment.words:
            word_start = window.to_recording_ms(word.start_ms)
            word_end = window.to_recording_ms(word.end_ms, closing=True)
            words.append(replace(word, start_ms=word_start, end_ms=max(word_start, word_end)))
        segments.append(replace(segment, start_ms=start, end_ms=end, words=tuple(words)))
    return replace(result, segments=tuple(segments))


def join_results(results: list[AsrResult]) -> AsrResult:
    """One result from windows' results already on the recording's time line: texts
    joined, segments in order (a single result is returned as it is)."""
    if len(results) == 1:
        return results[0]
    texts = [text for result in results if (text := result.text.strip())]
    if not texts:
        return AsrResult(text="")
    segments = tuple(segment for result in results for segment in result.segments)
    language = next(result.language for result in results if result.text.strip())
    return AsrResult(text=" ".join(texts), segments=segments, language=language)


def join_windows(results: list[tuple[SpeechWindow, AsrResult]]) -> AsrResult:
    """One result from windows' results, each moved onto the recording's time line."""
    return join_results([on_recording(window, result) for window, result in results])

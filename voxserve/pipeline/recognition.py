"""Whole-buffer recognition (uploads, Wyoming, `voxserve transcribe`) through the shared ASR
stage, as bulk work.

A recording is cut into windows of at most `asr.bulk_window_s` at quiet moments
(pipeline/windows.py) and each window is one bulk call on the ASR stage (pipeline/stage.py):
bulk holds at most `pipeline.asr.bulk_slots` slots, so live finals always find one, and
between its windows an upload queues again. Two 164 s uploads used to hold both slots for a
minute while live finals timed out.

Time: the request has the stage timeout plus its audio's length (a long upload is not late
for being long). Window k is due, for the stage's earliest-deadline-first order, when that
budget spread over the audio says (start + timeout + the window's end in the audio): a short
upload arriving behind long ones is due before their later windows, so it runs next rather
than after them, and uploads interleave. One that could not start within its budget is
refused at once (`overloaded`, retry hint) instead of answering 504 after the wait.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from voxserve.audio.pcm import Float32Array, Int16Array, to_float32
from voxserve.audio.resample import resample
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.context import EngineContext
from voxserve.pipeline.stage import PRIORITY_BULK
from voxserve.pipeline.windows import cut_windows
from voxserve.types import SAMPLE_RATE, AsrOptions, AsrResult, Segment

MIN_FILE_RATE = 4_000
MAX_FILE_RATE = 192_000


WindowResult = tuple[int, int, AsrResult]
"""A window's sample range (16 kHz, in the recording) and the engine's result for it."""


async def transcribe(
    ctx: EngineContext,
    samples: Int16Array,
    sample_rate: int,
    *,
    language: str | None = None,
    options: AsrOptions | None = None,
) -> AsrResult:
    """Recognise a whole recording, window by window (module docstring). `options` (prompt,
    temperature, word timestamps, task) go to every window's call; None asks nothing."""
    windows = _windows(ctx, samples, sample_rate, language=language, options=options)
    return join_windows([window async for window in windows])


async def transcribe_windows(
    ctx: EngineContext,
    samples: Int16Array,
    sample_rate: int,
    *,
    language: str | None = None,
    options: AsrOptions | None = None,
) -> AsyncIterator[AsrResult]:
    """`transcribe`, one window's result at a time in audio order as each is decoded
    (stream=true uploads), its times on the recording's time line. Refusals (bad rate,
    language, overloaded) come at the first step."""
    async for window in _windows(ctx, samples, sample_rate, language=language, options=options):
        yield join_windows([window])


async def _windows(
    ctx: EngineContext,
    samples: Int16Array,
    sample_rate: int,
    *,
    language: str | None,
    options: AsrOptions | None,
) -> AsyncIterator[WindowResult]:
    if not MIN_FILE_RATE <= sample_rate <= MAX_FILE_RATE:
        raise VoxError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"sample rate {sample_rate} is outside {MIN_FILE_RATE}-{MAX_FILE_RATE} Hz",
        )
    engines = ctx.engines
    language = engines.check_language(language)
    if samples.size == 0:
        raise VoxError(ErrorCode.EMPTY_AUDIO, "no audio to transcribe")
    audio = to_float32(resample(samples, sample_rate, SAMPLE_RATE))
    stage = ctx.stages.stage("asr")
    budget = stage.timeout_s + audio.size / SAMPLE_RATE
    began = time.monotonic()
    windows = cut_windows(audio, ctx.settings.asr.bulk_window_s)

    def due(end: int) -> float:
        """A window's deadline: the stage's timeout after the audio up to its end."""
        return began + stage.timeout_s + end / SAMPLE_RATE

    if stage.bulk_done_s(due(windows[0][1])) > budget:
        raise VoxError(
            ErrorCode.OVERLOADED,
            "the asr stage's bulk work would not reach this upload in time; retry later",
            retry_after_s=ctx.settings.flow.retry_after_s,
        )
    # only when asked: an engine written before `options` still serves plain uploads
    asr_kwargs: dict[str, Any] = {"options": options} if options is not None else {}
    for start, end in windows:
        left = began + budget - time.monotonic()
        if left <= 0:
            raise VoxError(
                ErrorCode.STAGE_TIMEOUT, f"asr did not answer within {budget:g} s", stage="asr"
            )
        window: Float32Array = audio[start:end]
        result: AsrResult = await stage.run(
            partial(engines.asr.transcribe, window, language=language, **asr_kwargs),
            timeout_s=left,
            deadline=due(end),
            priority=PRIORITY_BULK,
        )
        yield start, end, result


def join_windows(results: list[WindowResult]) -> AsrResult:
    """One result from windows' results (each with its sample range): texts joined,
    segments moved onto the recording's time line (a window without segments is one)."""
    if len(results) == 1 and results[0][0] == 0:
        return results[0][2]
    texts: list[str] = []
    segments: list[Segment] = []
    language: str | None = None
    for start, end, result in results:
        text = result.text.strip()
        if not text:
            continue
        texts.append(text)
        language = language or result.language
        offset = start * 1000 // SAMPLE_RATE
        own = result.segments or (Segment(text, 0, (end - start) * 1000 // SAMPLE_RATE),)
        segments.extend(s.shifted(offset) for s in own)
    text = " ".join(texts)
    if language is None:
        return AsrResult(text=text)
    return AsrResult(text=text, segments=tuple(segments), language=language)

"""POST /v1/audio/transcriptions and /v1/audio/translations: a multipart upload in any audio
format FFmpeg reads (audio/decode.py), recognised whole and answered in any of OpenAI's
response formats, or streamed as `transcript.text.delta` events window by window.

OpenAI streams only for its gpt-4o-* models and ignores `stream` for whisper-1; here
stream=true works with every model name (docs/protocol.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import TypeVar

from starlette.datastructures import FormData
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from voxserve.engines.base import asr_tasks
from voxserve.engines.loaded import Engines
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.pipeline.generations import Lease
from voxserve.pipeline.models.names import ModelEntry
from voxserve.pipeline.recognition.bulk import RecognitionContext, join_results, transcribe_windows
from voxserve.pipeline.recognition.upload_audio import (
    DecodedUpload,
    decode_upload,
    max_upload_seconds,
)
from voxserve.runtime import Chosen, Runtime
from voxserve.server.http.closing_stream import ClosingStream
from voxserve.server.http.transcript_formats import TRANSCRIPT_FORMATS, transcript_response
from voxserve.server.session.auth import ANONYMOUS
from voxserve.server.session.errors import error_body
from voxserve.server.session.http_requests import one_of, read_form, read_upload
from voxserve.server.session.quotas import quotas_of
from voxserve.types import SAMPLE_RATE, AsrOptions, AsrResult, AsrTask

FORM_OVERHEAD_BYTES = 64 * 1024
"""Room for multipart boundaries and the small text fields sent beside the uploaded file."""
T = TypeVar("T")
GRANULARITIES = ("word", "segment")
STREAM_FORMATS = ("json", "text")


@dataclass(frozen=True, slots=True)
class TranscriptionPlan:
    """A validated request (the audio is read separately)."""

    task: AsrTask
    language: str | None
    response_format: str
    options: AsrOptions
    stream: bool = False
    words: bool = False  # timestamp_granularities: the verbose_json parts to return
    segments: bool = True


async def transcriptions(runtime: Runtime, request: Request) -> Response:
    return await _recognise(runtime, request, "transcribe")


async def translations(runtime: Runtime, request: Request) -> Response:
    return await _recognise(runtime, request, "translate")


async def _recognise(runtime: Runtime, request: Request, task: AsrTask) -> Response:
    limits = runtime.settings.limits
    form = await read_form(request, limits.max_upload_bytes + FORM_OVERHEAD_BYTES)
    held: Lease | None = None
    try:
        try:
            entry = _model(runtime, _form_text(form, "model"), task)
            # A named model is loaded now (once, however many ask) and held to the answer's
            # end; the default is the runtime's own engines, as before.
            ctx: RecognitionContext = runtime
            if not entry.default:
                held = await runtime.models.lease(asr=entry.name)
                ctx = Chosen(runtime, held)
            plan = _plan(form, ctx.engines, task, limits.max_text_chars, entry.name)
            data = await read_upload(
                form, "file", limits.max_upload_bytes, what="an audio file upload"
            )
        finally:
            await form.close()
        # Decoded in the decode pool a window at a time, within the decoded-audio budget
        # (pipeline/recognition/upload_audio.py); a client gone stops it, and the transcription, at
        # once.
        upload = await _while_connected(
            request,
            decode_upload(
                data,
                max_seconds=max_upload_seconds(limits),
                pool=runtime.pools.decode,
                budget=runtime.upload_budget,
            ),
        )
        del data
        streaming = False
        try:
            response = await _while_connected(request, _answer(runtime, ctx, request, plan, upload))
            streaming = isinstance(response, ClosingStream)
            return response
        finally:
            if not streaming:  # a streamed body releases it when it ends (its sources)
                upload.held.release()
    finally:
        if held is not None:  # a streamed answer holds its own lease (transcribe_windows)
            held.release()


async def _while_connected(request: Request, work: Awaitable[T]) -> T:
    """`work`, cancelled if the client disconnects first (ClientDisconnect: nobody to answer).
    The body has been read: the next message can only be the disconnect."""
    job = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((job, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not job.done():
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)
        gone.cancel()
    if job.cancelled():
        raise ClientDisconnect()
    return job.result()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _answer(
    runtime: Runtime,
    ctx: RecognitionContext,
    request: Request,
    plan: TranscriptionPlan,
    upload: DecodedUpload,
) -> Response:
    samples = upload.samples
    duration_s = samples.size / SAMPLE_RATE
    # The key's audio minute pays for the whole upload before any model work (429 if not).
    principal = getattr(request.state, "principal", ANONYMOUS)
    quotas_of(runtime).spend_audio(principal, duration_s)
    options = plan.options if plan.options != AsrOptions() else None
    windows = transcribe_windows(
        ctx,
        samples,
        SAMPLE_RATE,
        language=plan.language,
        options=options,
        pool=runtime.pools.decode,
    )
    if not plan.stream:
        return transcript_response(
            join_results([result async for result in windows]),
            plan.response_format,
            duration_s,
            task=plan.task,
            words=plan.words,
            segments=plan.segments,
        )
    first = await anext(windows, None)  # refusals (overloaded) as a plain HTTP error
    if first is None:
        raise VoxError(ErrorCode.EMPTY_AUDIO, "no audio to transcribe")
    return ClosingStream(
        _events(first, windows),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
        sources=(windows, upload.held),  # a client gone: no more windows transcribed for it
    )


async def _events(first: AsrResult, rest: AsyncIterator[AsrResult]) -> AsyncIterator[bytes]:
    """`transcript.text.delta` per window with text, then `transcript.text.done` with the
    whole text; a failure after the first window is an `error` event (the SDK raises it)."""
    texts: list[str] = []

    def delta(window: AsrResult) -> bytes | None:
        text = window.text.strip()
        if not text:
            return None
        piece = (" " if texts else "") + text
        texts.append(text)
        return _sse({"type": "transcript.text.delta", "delta": piece})

    try:
        event = delta(first)
        if event:
            yield event
        async for window in rest:
            event = delta(window)
            if event:
                yield event
    except VoxError as exc:
        yield _sse({"type": "error", **error_body(exc)})
        return
    yield _sse({"type": "transcript.text.done", "text": " ".join(texts)})


def _sse(event: dict[str, object]) -> bytes:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


def _model(runtime: Runtime, name: str | None, task: AsrTask) -> ModelEntry:
    """The model `name` chooses (`unknown_model` listing the valid ones). A translation that
    names none of its own (none, or an OpenAI name) goes to the default if it translates,
    else to the first configured model that can."""
    models = runtime.models
    entry = models.entry("asr", name)
    if task == "translate" and entry.default and models.can_translate(entry) is False:
        entry = models.first_multilingual_asr() or entry
    return entry


def _plan(
    form: FormData, engines: Engines, task: AsrTask, max_prompt_chars: int, model: str
) -> TranscriptionPlan:
    if task not in asr_tasks(engines.asr):
        info = engines.asr.info
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            f"model {quoted(model)} is served by {info.name} {info.model!r}, which cannot "
            "translate (an English-only model); name a multilingual model for "
            "/v1/audio/translations ([models] in the config, GET /v1/models lists them)",
        )
    fmt = _form_text(form, "response_format") or "json"
    if fmt not in TRANSCRIPT_FORMATS:
        supported = ", ".join(TRANSCRIPT_FORMATS)
        raise VoxError(
            ErrorCode.UNSUPPORTED_ENCODING,
            f"response_format {quoted(fmt)} is not supported; use one of {supported}",
        )
    prompt = _form_text(form, "prompt") or None
    if prompt is not None and len(prompt) > max_prompt_chars:
        raise VoxError(
            ErrorCode.TEXT_TOO_LONG, f"prompt is longer than {max_prompt_chars} characters"
        )
    temperature = _temperature(_form_text(form, "temperature"))
    if task == "translate":  # no language, stream or granularities on translations
        options = AsrOptions(prompt=prompt, temperature=temperature, task="translate")
        return TranscriptionPlan(task, None, fmt, options)
    stream = _stream(_form_text(form, "stream"))
    if stream and fmt not in STREAM_FORMATS:
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            f"stream=true answers transcript.text events: response_format {quoted(fmt)} "
            "cannot stream; use json or text, or stream=false",
        )
    granularities = _granularities(form)
    words = fmt == "verbose_json" and "word" in granularities
    language = engines.check_language(_form_text(form, "language") or None)
    options = AsrOptions(prompt=prompt, temperature=temperature, word_timestamps=words)
    segments = not granularities or "segment" in granularities
    return TranscriptionPlan(task, language, fmt, options, stream, words, segments)


def _stream(value: str | None) -> bool:
    flag = (value or "false").lower()
    if flag not in ("true", "false"):
        raise VoxError(
            ErrorCode.INVALID_PARAMETER, f"stream must be true or false, not {quoted(value)}"
        )
    return flag == "true"


def _temperature(value: str | None) -> float | None:
    """OpenAI's 0..1; absent: the engine's own decoding (with its fallbacks)."""
    if value is None or value == "":
        return None
    try:
        temperature = float(value)
    except ValueError:
        temperature = -1.0
    if not 0.0 <= temperature <= 1.0:
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            f"temperature must be a number within 0..1, not {quoted(value)}",
        )
    return temperature


def _granularities(form: FormData) -> set[str]:
    """`timestamp_granularities[]` as the SDK sends it (one field per value), or without []."""
    values: list[str] = []
    for name in ("timestamp_granularities[]", "timestamp_granularities"):
        for value in form.getlist(name):
            if not isinstance(value, str):
                raise VoxError(ErrorCode.INVALID_PARAMETER, f"form field {name} must be text")
            values.append(value)
    for value in values:
        one_of(value, GRANULARITIES, "timestamp granularity")
    return set(values)


def _form_text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if value is None or isinstance(value, str):
        return value
    raise VoxError(ErrorCode.INVALID_PARAMETER, f"form field {name} must be text, not a file")

"""OpenAI-compatible HTTP audio: speech, transcriptions, voices and models under /v1.

The shapes follow OpenAI's audio API closely enough that the official `openai` SDK works
unchanged against ``base_url=http://host:port/v1``. Every request is validated in full before
any byte of a response is sent, so a client mistake is always a 4xx JSON error
(`voxserve.server.errors.error_response`) and never a truncated stream.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

from voxserve.audio.pcm import Int16Array
from voxserve.audio.resample import check_rate
from voxserve.audio.wav import read_wav, wav_header
from voxserve.config import Settings
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.recognition import transcribe
from voxserve.pipeline.synthesis import check_speed, check_text, synthesize
from voxserve.runtime import OPENAI_ASR_MODELS, OPENAI_TTS_MODELS, Engines, Runtime
from voxserve.server.errors import error_response
from voxserve.types import SUPPORTED_OUTPUT_RATES, AsrResult, Segment, Voice

log = logging.getLogger(__name__)

SPEECH_MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm"}
OPENAI_PCM_RATE = 24_000
"""OpenAI's `pcm` is 24 kHz 16-bit mono; clients decode it assuming that rate."""
TRANSCRIPT_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
FORM_OVERHEAD_BYTES = 64 * 1024
"""Room for multipart boundaries and the small text fields sent beside the uploaded file."""
MAX_FORM_FIELDS = 32
TRACE_HEADER = "X-Voxserve-Trace-Id"
RATE_HEADER = "X-Voxserve-Sample-Rate"

Handler = Callable[[Request, str], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


def routes(runtime: Runtime) -> list[BaseRoute]:
    """The /v1 HTTP routes; each answers 503 `not_ready` until the engines are loaded."""

    async def speech(request: Request, trace_id: str) -> Response:
        return await _speech(runtime, request, trace_id)

    async def transcriptions(request: Request, trace_id: str) -> Response:
        return await _transcriptions(runtime, request)

    async def voices(request: Request, trace_id: str) -> Response:
        return _voices(runtime.engines)

    async def models(request: Request, trace_id: str) -> Response:
        return _models(runtime.engines)

    return [
        Route("/v1/audio/speech", _guarded(speech), methods=["POST"]),
        Route("/v1/audio/transcriptions", _guarded(transcriptions), methods=["POST"]),
        Route("/v1/voices", _guarded(voices), methods=["GET"]),
        Route("/v1/models", _guarded(models), methods=["GET"]),
    ]


# --- shared plumbing ------------------------------------------------------------------------


def _guarded(handler: Handler) -> Endpoint:
    """Turn every VoxError into the OpenAI error body, and anything else into a logged 500
    whose trace id the client can quote (the log line carries no request content)."""

    async def endpoint(request: Request) -> Response:
        trace_id = uuid.uuid4().hex[:16]
        try:
            response = await handler(request, trace_id)
        except VoxError as exc:
            response = error_response(exc)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is listening any more
        except Exception as exc:
            log.error(
                "http audio request failed",
                extra={"trace_id": trace_id, "path": request.url.path, "error": type(exc).__name__},
            )
            response = error_response(
                VoxError(ErrorCode.INTERNAL, f"internal error; trace id {trace_id}")
            )
        response.headers[TRACE_HEADER] = trace_id
        return response

    return endpoint


def _capped(receive: Receive, limit: int) -> Receive:
    """Count request body bytes as they arrive and stop at `limit`, so an oversized body is
    refused after reading at most `limit` bytes instead of being buffered whole."""
    received = 0

    async def capped_receive() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise _too_large(limit)
        return message

    return capped_receive


def _too_large(limit: int) -> VoxError:
    return VoxError(ErrorCode.MESSAGE_TOO_LARGE, f"request body is larger than {limit} bytes")


def _check_declared_length(request: Request, limit: int) -> None:
    """Refuse at once when Content-Length already says the body is too big."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)


def _str_field(value: object, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise VoxError(ErrorCode.INVALID_PARAMETER, f"{name} must be a string")


def _one_of(value: str | None, valid: Iterable[str], name: str) -> str | None:
    names = list(dict.fromkeys(valid))
    if value is None or value in names:
        return value
    listed = ", ".join(names)
    raise VoxError(ErrorCode.INVALID_PARAMETER, f"unknown {name} {value!r}; valid: {listed}")


# --- POST /v1/audio/speech ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpeechPlan:
    """A fully validated speech request."""

    text: str
    voice: Voice
    speed: float
    sample_rate: int
    response_format: str


async def _speech(runtime: Runtime, request: Request, trace_id: str) -> Response:
    engines = runtime.engines
    body = await _read_json(request, runtime.settings.limits.max_message_bytes)
    plan = _speech_plan(body, engines, runtime.settings)
    chunks = synthesize(
        runtime, plan.text, voice=plan.voice.id, speed=plan.speed, sample_rate=plan.sample_rate
    )
    # Waiting for the first chunk before answering keeps a failing engine a JSON error,
    # and the first byte the client sees is real audio (time-to-first-audio = the engine's).
    first = await _first_chunk(chunks)
    prefix = wav_header(plan.sample_rate) if plan.response_format == "wav" else b""
    return _AudioStream(
        _audio_bytes(chunks, first, prefix, trace_id),
        media_type=SPEECH_MEDIA_TYPES[plan.response_format],
        headers={
            RATE_HEADER: str(plan.sample_rate),
            "X-Voxserve-Voice": plan.voice.id,
            "Cache-Control": "no-store",
        },
    )


async def _read_json(request: Request, limit: int) -> dict[str, Any]:
    _check_declared_length(request, limit)
    raw = await Request(request.scope, _capped(request.receive, limit)).body()
    try:
        body = json.loads(raw)
    except ValueError:
        raise VoxError(ErrorCode.INVALID_JSON, "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise VoxError(ErrorCode.INVALID_JSON, "request body must be a JSON object")
    return body


def _speech_plan(body: dict[str, Any], engines: Engines, settings: Settings) -> SpeechPlan:
    text = body.get("input")
    if not isinstance(text, str):
        raise VoxError(ErrorCode.INVALID_PARAMETER, "input must be a string: the text to speak")
    text = check_text(text, settings.limits.max_text_chars)
    model = _str_field(body.get("model"), "model")
    voice = _speech_voice(engines, model, _str_field(body.get("voice"), "voice"))
    response_format = _speech_format(body)
    speed = check_speed(_number(body.get("speed", 1.0), "speed"))
    default_rate = OPENAI_PCM_RATE if response_format == "pcm" else settings.tts.output_sample_rate
    rate = body.get("sample_rate")
    if rate is None:
        rate = default_rate
    elif not isinstance(rate, int) or isinstance(rate, bool):
        raise VoxError(ErrorCode.INVALID_PARAMETER, "sample_rate must be an integer (Hz)")
    return SpeechPlan(text, voice, speed, check_rate(rate, SUPPORTED_OUTPUT_RATES), response_format)


def _speech_voice(engines: Engines, model: str | None, voice_id: str | None) -> Voice:
    """OpenAI model names (or none) mean the default engines; an engine name ("piper",
    "espeak") restricts the voice to that engine and picks its first voice by default."""
    by_name = {engine.info.name: engine for engine in engines.tts}
    _one_of(model, (*OPENAI_TTS_MODELS, *by_name), "model")
    engine = by_name.get(model or "")
    if engine is None:
        return engines.voice(voice_id)[0]
    own = engine.voices()
    if voice_id is None and own:
        return own[0]
    if voice_id is not None:
        voice, owner = engines.voice(voice_id)
        if owner is engine:
            return voice
    valid = ", ".join(v.id for v in own) or "none"
    raise VoxError(
        ErrorCode.UNKNOWN_VOICE, f"voice {voice_id!r} is not a {model} voice; valid voices: {valid}"
    )


def _speech_format(body: dict[str, Any]) -> str:
    fmt = _str_field(body.get("response_format"), "response_format") or "wav"
    if fmt not in SPEECH_MEDIA_TYPES:
        supported = ", ".join(SPEECH_MEDIA_TYPES)
        raise VoxError(
            ErrorCode.UNSUPPORTED_ENCODING,
            f"response_format {fmt!r} is not supported; use one of {supported}",
        )
    stream_format = _str_field(body.get("stream_format"), "stream_format")
    if stream_format not in (None, "audio"):
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            f"stream_format {stream_format!r} is not supported; audio is always streamed raw",
        )
    return fmt


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VoxError(ErrorCode.INVALID_PARAMETER, f"{name} must be a number")
    return float(value)


async def _first_chunk(chunks: AsyncIterator[Int16Array]) -> Int16Array | None:
    """The first chunk, closing the generator (and so the synthesis) if it fails."""
    try:
        return await anext(chunks, None)
    except BaseException:
        await _aclose(chunks)
        raise


async def _audio_bytes(
    chunks: AsyncIterator[Int16Array], first: Int16Array | None, prefix: bytes, trace_id: str
) -> AsyncIterator[bytes]:
    """Little-endian PCM16 as it is made. An engine failure mid-stream can only end the
    stream (the status line is gone), so it is logged with the trace id and the stream ends."""
    try:
        yield prefix + (_le_bytes(first) if first is not None else b"")
        if first is None:
            return
        async for chunk in chunks:
            yield _le_bytes(chunk)
    except Exception as exc:
        code = exc.code.value if isinstance(exc, VoxError) else type(exc).__name__
        log.warning("speech stream ended early", extra={"trace_id": trace_id, "error": code})
    finally:
        await _aclose(chunks)


def _le_bytes(samples: Int16Array) -> bytes:
    return samples.astype("<i2", copy=False).tobytes()


async def _aclose(iterator: object) -> None:
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()


class _AudioStream(StreamingResponse):
    """A streaming response that always closes its body generator when it ends: on a client
    disconnect, Starlette may abandon the iterator suspended at a `yield`, and closing it
    is what stops the synthesis between chunks rather than whenever it is garbage collected."""

    def __init__(
        self, content: AsyncIterator[bytes], *, media_type: str, headers: dict[str, str]
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._source = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await _aclose(self._source)


# --- POST /v1/audio/transcriptions ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TranscriptionPlan:
    """A validated transcription request (the audio is read separately)."""

    language: str | None
    response_format: str


async def _transcriptions(runtime: Runtime, request: Request) -> Response:
    engines = runtime.engines
    max_upload = runtime.settings.limits.max_upload_bytes
    form = await _read_form(request, max_upload + FORM_OVERHEAD_BYTES)
    try:
        plan = _transcription_plan(form, engines)
        data = await _read_upload(form, max_upload)
    finally:
        await form.close()
    samples, rate = _decode_wav(data)
    result = await transcribe(runtime, samples, rate, language=plan.language)
    return _transcript_response(result, plan.response_format, samples.size / rate)


async def _read_form(request: Request, limit: int) -> FormData:
    _check_declared_length(request, limit)
    capped = Request(request.scope, _capped(request.receive, limit))
    try:
        return await capped.form(max_files=1, max_fields=MAX_FORM_FIELDS)
    except HTTPException as exc:  # malformed multipart, too many parts
        raise VoxError(ErrorCode.INVALID_PARAMETER, f"bad multipart form: {exc.detail}") from None


def _transcription_plan(form: FormData, engines: Engines) -> TranscriptionPlan:
    models = (*OPENAI_ASR_MODELS, engines.asr.info.name, "whisper")
    _one_of(_form_text(form, "model"), models, "model")
    if (_form_text(form, "stream") or "false").lower() == "true":
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            "stream=true is not supported here; use the /v1/stream WebSocket for live results",
        )
    fmt = _form_text(form, "response_format") or "json"
    if fmt not in TRANSCRIPT_FORMATS:
        supported = ", ".join(TRANSCRIPT_FORMATS)
        raise VoxError(
            ErrorCode.UNSUPPORTED_ENCODING,
            f"response_format {fmt!r} is not supported; use one of {supported}",
        )
    language = engines.check_language(_form_text(form, "language") or None)
    return TranscriptionPlan(language, fmt)


def _form_text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if value is None or isinstance(value, str):
        return value
    raise VoxError(ErrorCode.INVALID_PARAMETER, f"form field {name} must be text, not a file")


async def _read_upload(form: FormData, limit: int) -> bytes:
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise VoxError(ErrorCode.INVALID_PARAMETER, "form field 'file' (a WAV upload) is required")
    if upload.size is not None and upload.size > limit:
        raise VoxError(ErrorCode.MESSAGE_TOO_LARGE, f"the upload is larger than {limit} bytes")
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise VoxError(ErrorCode.MESSAGE_TOO_LARGE, f"the upload is larger than {limit} bytes")
    return data


def _decode_wav(data: bytes) -> tuple[Int16Array, int]:
    """read_wav, with any parse failure it does not anticipate reported as invalid audio."""
    try:
        return read_wav(data)
    except VoxError:
        raise
    except Exception as exc:
        raise VoxError(ErrorCode.INVALID_AUDIO, "not a readable WAV file") from exc


def _transcript_response(result: AsrResult, fmt: str, duration_s: float) -> Response:
    text = result.text.strip()
    if fmt == "text":
        return PlainTextResponse(text + "\n")
    if fmt == "json":
        return JSONResponse({"text": text})
    segments = result.segments or (Segment(text, 0, round(duration_s * 1000)),)
    if fmt == "srt":
        return PlainTextResponse(_srt(segments))
    if fmt == "vtt":
        return Response(_vtt(segments), media_type="text/vtt")
    return JSONResponse(
        {
            "task": "transcribe",
            "language": result.language,
            "duration": round(duration_s, 3),
            "text": text,
            "segments": [_verbose_segment(i, s) for i, s in enumerate(segments)],
        }
    )


def _verbose_segment(index: int, segment: Segment) -> dict[str, object]:
    """OpenAI's segment shape; scores whisper does not expose to us are reported as 0."""
    return {
        "id": index,
        "seek": 0,
        "start": segment.start_ms / 1000,
        "end": segment.end_ms / 1000,
        "text": segment.text,
        "tokens": [],
        "temperature": 0.0,
        "avg_logprob": 0.0,
        "compression_ratio": 0.0,
        "no_speech_prob": 0.0,
    }


def _timestamp(ms: int, separator: str) -> str:
    hours, rest = divmod(max(0, ms), 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{separator}{millis:03d}"


def _srt(segments: Iterable[Segment]) -> str:
    blocks = [
        f"{i}\n{_timestamp(s.start_ms, ',')} --> {_timestamp(s.end_ms, ',')}\n{s.text.strip()}\n"
        for i, s in enumerate(segments, start=1)
    ]
    return "\n".join(blocks)


def _vtt(segments: Iterable[Segment]) -> str:
    cues = [
        f"{_timestamp(s.start_ms, '.')} --> {_timestamp(s.end_ms, '.')}\n{s.text.strip()}\n"
        for s in segments
    ]
    return "WEBVTT\n\n" + "\n".join(cues)


# --- GET /v1/voices, GET /v1/models ---------------------------------------------------------


def _voices(engines: Engines) -> Response:
    return JSONResponse(
        {"voices": [asdict(v) for v in engines.voices()], "default": engines.default_voice}
    )


def _models(engines: Engines) -> Response:
    """Every model name the audio routes accept, in OpenAI's list shape (`models.list()`)."""
    names = (
        *OPENAI_TTS_MODELS,
        *(engine.info.name for engine in engines.tts),
        *OPENAI_ASR_MODELS,
        engines.asr.info.name,
        "whisper",
    )
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "voxserve"}
        for name in dict.fromkeys(names)
    ]
    return JSONResponse({"object": "list", "data": data})

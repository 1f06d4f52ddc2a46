"""POST /v1/audio/transcriptions: a multipart WAV upload, transcribed whole, answered in
any of OpenAI's response formats (json, text, verbose_json, srt, vtt)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from voxserve.audio.pcm import Int16Array
from voxserve.audio.wav import read_wav
from voxserve.engines.loaded import Engines
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.pipeline.recognition import transcribe
from voxserve.runtime import Runtime
from voxserve.server.auth import ANONYMOUS
from voxserve.server.http_requests import one_of, read_form
from voxserve.server.openai_models import OPENAI_ASR_MODELS
from voxserve.server.quotas import quotas_of
from voxserve.types import AsrResult, Segment

TRANSCRIPT_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
FORM_OVERHEAD_BYTES = 64 * 1024
"""Room for multipart boundaries and the small text fields sent beside the uploaded file."""


@dataclass(frozen=True, slots=True)
class TranscriptionPlan:
    """A validated transcription request (the audio is read separately)."""

    language: str | None
    response_format: str


async def transcriptions(runtime: Runtime, request: Request) -> Response:
    engines = runtime.engines
    max_upload = runtime.settings.limits.max_upload_bytes
    form = await read_form(request, max_upload + FORM_OVERHEAD_BYTES)
    try:
        plan = _transcription_plan(form, engines)
        data = await _read_upload(form, max_upload)
    finally:
        await form.close()
    samples, rate = _decode_wav(data)
    # The key's audio minute pays for the whole upload before any model work (429 if not).
    principal = getattr(request.state, "principal", ANONYMOUS)
    quotas_of(runtime).spend_audio(principal, samples.size / rate)
    result = await transcribe(runtime, samples, rate, language=plan.language)
    return _transcript_response(result, plan.response_format, samples.size / rate)


def _transcription_plan(form: FormData, engines: Engines) -> TranscriptionPlan:
    models = (*OPENAI_ASR_MODELS, engines.asr.info.name, "whisper")
    one_of(_form_text(form, "model"), models, "model")
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
            f"response_format {quoted(fmt)} is not supported; use one of {supported}",
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

"""A recognition result in OpenAI's transcription response formats: json, text, srt, vtt and
verbose_json (segments with the engine's scores, and `words` when word timestamps were
asked for), for /v1/audio/transcriptions and /v1/audio/translations alike."""

from __future__ import annotations

from collections.abc import Iterable

from starlette.responses import JSONResponse, PlainTextResponse, Response

from voxserve.server.http.language_names import language_name
from voxserve.types import AsrResult, AsrTask, Segment, Word

TRANSCRIPT_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")


def transcript_response(
    result: AsrResult,
    fmt: str,
    duration_s: float,
    *,
    task: AsrTask = "transcribe",
    words: bool = False,
    segments: bool = True,
) -> Response:
    """`words`/`segments`: which timestamp granularities verbose_json carries."""
    text = result.text.strip()
    if fmt == "text":
        return PlainTextResponse(text + "\n")
    if fmt == "json":
        return JSONResponse({"text": text})
    # An engine without segments: the whole text is one. No text (silence): no segment, as
    # OpenAI's `segments: []`, not one empty span with made-up scores.
    spans = result.segments or ((Segment(text, 0, round(duration_s * 1000)),) if text else ())
    if fmt == "srt":
        return PlainTextResponse(_srt(spans))
    if fmt == "vtt":
        return Response(_vtt(spans), media_type="text/vtt")
    body: dict[str, object] = {
        "task": task,
        # OpenAI names the language in full here ("english"); a translation is English.
        "language": "english" if task == "translate" else language_name(result.language),
        "duration": round(duration_s, 3),
        "text": text,
    }
    if segments:
        body["segments"] = [_verbose_segment(i, s) for i, s in enumerate(spans)]
    if words:
        body["words"] = [_word(w) for s in spans for w in s.words]
    body["usage"] = {"type": "duration", "seconds": round(duration_s, 3)}
    return JSONResponse(body)


def _verbose_segment(index: int, segment: Segment) -> dict[str, object]:
    """OpenAI's segment shape with the engine's values (`seek`: the segment's start in
    10 ms frames, as Whisper counts its windows)."""
    return {
        "id": index,
        "seek": segment.start_ms // 10,
        "start": segment.start_ms / 1000,
        "end": segment.end_ms / 1000,
        "text": segment.text,
        "tokens": list(segment.tokens),
        "temperature": segment.temperature,
        "avg_logprob": segment.avg_logprob,
        "compression_ratio": segment.compression_ratio,
        "no_speech_prob": segment.no_speech_prob,
    }


def _word(word: Word) -> dict[str, object]:
    return {"word": word.word.strip(), "start": word.start_ms / 1000, "end": word.end_ms / 1000}


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

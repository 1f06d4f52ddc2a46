"""What `/v1/audio/speech` sends: the response format's rate and content type, and the body,
encoded as it is synthesised (audio/encode.py), either raw (`stream_format` "audio") or as
OpenAI's server-sent events (`stream_format` "sse": `speech.audio.delta`, then one
`speech.audio.done` with usage). A reply whose encoding the TTS cache holds is sent from
it (`cached_body`); a complete encoding made here is handed back to be kept (`Keeper`,
pipeline/synthesis/encodings.py)."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from voxserve.audio.encode import CODECS, FORMATS, Encoder, open_encoder
from voxserve.audio.pcm import Int16Array
from voxserve.audio.resample import check_rate
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.pipeline.scheduling.work_pools import WorkPool
from voxserve.pipeline.streams import aclose
from voxserve.server.session.http_requests import log
from voxserve.server.session.json_input import optional_str
from voxserve.types import SUPPORTED_OUTPUT_RATES

# Content types as api.openai.com sends them. Its OpenAPI spec says only
# application/octet-stream; openai/openai-openapi#141 reports the real headers (audio/mpeg,
# audio/aac, ...). For opus, audio/opus is what OpenAI-compatible servers that mirror it send
# (e.g. Kokoro-FastAPI); not checked against api.openai.com from here (RFC 7845 would say
# audio/ogg for an Ogg Opus file). Clients of this route read the bytes, not the type.
MEDIA_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/opus",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
SSE_MEDIA_TYPE = "text/event-stream"
STREAM_FORMATS = ("audio", "sse")
DEFAULT_FORMAT = "mp3"  # OpenAI's default when response_format is omitted
OPENAI_RATE = 24_000
"""OpenAI's speech is 24 kHz (its `pcm` is documented so; clients decode `pcm` at that rate)."""
OPUS_RATE = 48_000  # Ogg Opus is decoded at 48 kHz: synthesised at that rate, one resample
# usage in `speech.audio.done` is an approximation (documented in docs/protocol.md): the
# engines have no tokens. Text: OpenAI's rule of thumb of 4 characters a token; audio: 20
# tokens a second (50 ms each), the rate of OpenAI's audio output tokens.
CHARS_PER_TOKEN = 4
AUDIO_TOKEN_S = 0.05
ENCODE_IN_THREAD_SAMPLES = 2_400  # bigger chunks are encoded off the event loop (the encode pool)
SSE_CACHED_DELTA_BYTES = 16_384  # a cached encoding as SSE: deltas of this many bytes


class Keeper(Protocol):
    """Where a complete encoding goes (the TTS cache, beside its PCM)."""

    max_bytes: int  # a longer encoding is not collected

    def keep(self, data: bytes, samples: int) -> None: ...


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """How the audio of one request leaves: format, rate and raw or SSE."""

    response_format: str
    stream_format: str
    sample_rate: int

    @property
    def media_type(self) -> str:
        if self.stream_format == "sse":
            return SSE_MEDIA_TYPE
        return MEDIA_TYPES[self.response_format]


def output_plan(body: dict[str, Any], default_wav_rate: int) -> OutputPlan:
    """`response_format` (mp3 when omitted, as OpenAI), `stream_format` and the voxserve
    extension `sample_rate` (a supported output rate the format takes)."""
    fmt = optional_str(body.get("response_format"), "response_format") or DEFAULT_FORMAT
    if fmt not in FORMATS:
        raise VoxError(
            ErrorCode.UNSUPPORTED_ENCODING,
            f"response_format {quoted(fmt)} is not supported; use one of {', '.join(FORMATS)}",
        )
    stream_format = optional_str(body.get("stream_format"), "stream_format") or "audio"
    if stream_format not in STREAM_FORMATS:
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            f"stream_format {quoted(stream_format)} is not supported; use audio or sse",
        )
    rate = body.get("sample_rate")
    if rate is None:
        defaults = {"wav": default_wav_rate, "opus": OPUS_RATE}
        rate = defaults.get(fmt, OPENAI_RATE)
    elif not isinstance(rate, int) or isinstance(rate, bool):
        raise VoxError(ErrorCode.INVALID_PARAMETER, "sample_rate must be an integer (Hz)")
    rate = check_rate(rate, SUPPORTED_OUTPUT_RATES)
    takes = CODECS[fmt].rates
    if takes is not None and rate not in takes:
        raise VoxError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"sample_rate {rate} is not available for {fmt}; use one of "
            + ", ".join(str(r) for r in takes),
        )
    return OutputPlan(fmt, stream_format, rate)


async def speech_body(
    plan: OutputPlan,
    chunks: AsyncIterator[Int16Array],
    first: Int16Array,
    text: str,
    trace_id: str,
    pool: WorkPool,
    keeper: Keeper | None = None,
) -> AsyncIterator[bytes]:
    """The response body: the encoded audio, raw or as SSE events, sent as it is made. An
    engine failure mid-stream can only end the stream (the status line is gone), so it is
    logged with the trace id and the stream ends (an SSE stream then has no
    `speech.audio.done`). `keeper`: given the whole encoding once it is complete."""
    encoder = open_encoder(plan.response_format, plan.sample_rate)
    samples = 0
    made = _Collected(keeper.max_bytes if keeper is not None else -1)
    try:
        async for chunk in _prepend(first, chunks):
            samples += chunk.size
            data = await _encode(encoder, chunk, pool)
            if data:
                made.add(data)
                yield _frame(plan, data)
        tail = encoder.finish()
        if tail:
            made.add(tail)
            yield _frame(plan, tail)
        if keeper is not None and made.whole:
            keeper.keep(made.data(), samples)
        if plan.stream_format == "sse":
            yield _sse(_done_event(text, samples / plan.sample_rate))
    except Exception as exc:
        code = exc.code.value if isinstance(exc, VoxError) else type(exc).__name__
        log.warning("speech stream ended early", extra={"trace_id": trace_id, "error": code})
    finally:
        encoder.close()
        await aclose(chunks)


class _Collected:
    """The encoded bytes of one reply, up to `limit` (past it, nothing: it is not kept)."""

    def __init__(self, limit: int) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._limit = limit
        self.whole = limit >= 0

    def add(self, data: bytes) -> None:
        if self.whole:
            self._size += len(data)
            self.whole = self._size <= self._limit
            if self.whole:
                self._parts.append(data)
            else:
                self._parts.clear()

    def data(self) -> bytes:
        return b"".join(self._parts)


def cached_body(plan: OutputPlan, data: bytes, samples: int, text: str) -> bytes:
    """The body of a reply whose whole encoding is cached: the bytes, raw or as SSE
    deltas and the done event."""
    if plan.stream_format != "sse":
        return data
    deltas = (
        _frame(plan, data[at : at + SSE_CACHED_DELTA_BYTES])
        for at in range(0, len(data), SSE_CACHED_DELTA_BYTES)
    )
    return b"".join((*deltas, _sse(_done_event(text, samples / plan.sample_rate))))


async def _prepend(first: Int16Array, rest: AsyncIterator[Int16Array]) -> AsyncIterator[Int16Array]:
    yield first
    async for chunk in rest:
        yield chunk


async def _encode(encoder: Encoder, chunk: Int16Array, pool: WorkPool) -> bytes:
    if chunk.size > ENCODE_IN_THREAD_SAMPLES and not encoder.raw:
        return await pool.run(encoder.encode, chunk)
    return encoder.encode(chunk)


def _frame(plan: OutputPlan, data: bytes) -> bytes:
    if plan.stream_format != "sse":
        return data
    return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def _done_event(text: str, seconds: float) -> dict[str, Any]:
    input_tokens = math.ceil(len(text) / CHARS_PER_TOKEN)
    output_tokens = math.ceil(seconds / AUDIO_TOKEN_S)
    usage = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }
    return {"type": "speech.audio.done", "usage": usage}

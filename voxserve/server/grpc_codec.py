"""voxserve.v1 messages <-> the pipeline's values, and VoxError -> gRPC status, as pure
functions (no I/O, no server), so every mapping is unit-tested and fuzzable apart from a call.

Configs are turned into the WebSocket's `session.start` dict and validated by the same
`parse_start`, so both transports accept and refuse exactly the same values with the same
codes. Outgoing events keep the WebSocket's names and fields, typed (see the proto).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from voxserve.errors import ErrorCode, VoxError, shortened
from voxserve.pipeline.stream_config import Mode, StreamConfig
from voxserve.pipeline.synthesis import check_speed
from voxserve.server.ws_protocol import (
    CancelMessage,
    ClientMessage,
    EndMessage,
    MarkMessage,
    TextMessage,
    parse_start,
)
from voxserve.types import FRAME_MS
from voxserve.v1 import voxserve_pb2 as pb

ERROR_CODE_KEY = "voxserve-error-code"
"""Trailing metadata key holding the voxserve code of a call that ended with an error."""
TRACE_ID_KEY = "voxserve-trace-id"
RETRY_AFTER_KEY = "voxserve-retry-after-ms"
MAX_MARK_ID = 64
SEQ_MOD = 1 << 32
MAX_DETAILS = 512
"""Characters of an error message sent as a call's status details: they travel in the
trailing metadata, which the client caps (8 KiB by default); past it the status and the
voxserve code are lost. Messages quote client values cut short (errors.quoted); this is the
transport's own bound."""

S = grpc.StatusCode
_STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.NOT_STARTED: S.INVALID_ARGUMENT,
    ErrorCode.ALREADY_STARTED: S.INVALID_ARGUMENT,
    ErrorCode.INVALID_JSON: S.INVALID_ARGUMENT,
    ErrorCode.INVALID_MESSAGE: S.INVALID_ARGUMENT,
    ErrorCode.UNKNOWN_MODE: S.INVALID_ARGUMENT,
    ErrorCode.UNKNOWN_VOICE: S.INVALID_ARGUMENT,
    ErrorCode.UNKNOWN_LANGUAGE: S.INVALID_ARGUMENT,
    ErrorCode.UNSUPPORTED_SAMPLE_RATE: S.INVALID_ARGUMENT,
    ErrorCode.UNSUPPORTED_ENCODING: S.INVALID_ARGUMENT,
    ErrorCode.ODD_LENGTH_PCM: S.INVALID_ARGUMENT,
    ErrorCode.FRAME_TOO_SHORT: S.INVALID_ARGUMENT,
    ErrorCode.FRAME_TOO_LARGE: S.INVALID_ARGUMENT,
    # What grpc itself answers for a message over the receive limit, so a client sees one
    # status for both.
    ErrorCode.MESSAGE_TOO_LARGE: S.RESOURCE_EXHAUSTED,
    ErrorCode.TEXT_TOO_LONG: S.INVALID_ARGUMENT,
    ErrorCode.EMPTY_TEXT: S.INVALID_ARGUMENT,
    ErrorCode.EMPTY_AUDIO: S.INVALID_ARGUMENT,
    ErrorCode.INVALID_AUDIO: S.INVALID_ARGUMENT,
    ErrorCode.INVALID_PARAMETER: S.INVALID_ARGUMENT,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: S.INVALID_ARGUMENT,  # HTTP only; listed for completeness
    ErrorCode.WRONG_MODE: S.INVALID_ARGUMENT,
    ErrorCode.STAGE_TIMEOUT: S.DEADLINE_EXCEEDED,
    # HTTP says 502 (a dependency failed); gRPC's equivalent is UNAVAILABLE: retry may help.
    ErrorCode.ENGINE_ERROR: S.UNAVAILABLE,
    ErrorCode.OVERLOADED: S.RESOURCE_EXHAUSTED,
    ErrorCode.QUOTA_EXCEEDED: S.RESOURCE_EXHAUSTED,
    ErrorCode.IDLE_TIMEOUT: S.DEADLINE_EXCEEDED,
    ErrorCode.SESSION_EXPIRED: S.DEADLINE_EXCEEDED,
    ErrorCode.NOT_READY: S.UNAVAILABLE,
    ErrorCode.SHUTTING_DOWN: S.UNAVAILABLE,
    ErrorCode.CLIENT_STALLED: S.ABORTED,
    ErrorCode.RESUME_FAILED: S.NOT_FOUND,
    ErrorCode.INTERNAL: S.INTERNAL,
}
# Codes other features add (admin routes, TTS degradation) map by name when they exist, so
# this module does not need to know every feature's codes to stay importable.
_BY_NAME = {
    "tts_degraded": S.UNAVAILABLE,
    "unauthorized": S.UNAUTHENTICATED,
    "admin_disabled": S.PERMISSION_DENIED,
    "origin_not_allowed": S.PERMISSION_DENIED,
}

_MODES: dict[int, Mode] = {pb.MODE_ASR: "asr", pb.MODE_TTS: "tts", pb.MODE_ASSISTANT: "assistant"}
_MODE_ENUM: dict[str, int] = {name: value for value, name in _MODES.items()}


def status_for(code: ErrorCode) -> grpc.StatusCode:
    """The gRPC status a voxserve code ends a call with (UNKNOWN for a code not listed)."""
    return _STATUS.get(code) or _BY_NAME.get(code.value, S.UNKNOWN)


def details(error: VoxError) -> str:
    """The status details for `error`: its message, never longer than MAX_DETAILS."""
    return shortened(error.message, MAX_DETAILS)


def trailing_metadata(error: VoxError, trace_id: str | None = None) -> tuple[tuple[str, str], ...]:
    """What a failed call carries besides its status: the voxserve code (always), the trace
    id that finds it in the logs, and when to retry for overload and readiness."""
    items = [(ERROR_CODE_KEY, error.code.value)]
    if trace_id:
        items.append((TRACE_ID_KEY, trace_id))
    retry_s = getattr(error, "retry_after_s", None)
    if retry_s is not None:
        items.append((RETRY_AFTER_KEY, str(int(retry_s * 1000))))
    elif error.code in (ErrorCode.OVERLOADED, ErrorCode.NOT_READY):
        items.append((RETRY_AFTER_KEY, "1000"))
    return tuple(items)


# --- configs -------------------------------------------------------------------------------


def stream_config(message: pb.StreamConfig, default_mode: Mode = "assistant") -> StreamConfig:
    """A Converse config, validated exactly as the WebSocket's session.start."""
    if message.mode == pb.MODE_UNSPECIFIED:
        mode: object = default_mode
    else:
        mode = _MODES.get(message.mode, f"enum value {message.mode}")
    data: dict[str, Any] = {"mode": mode}
    _put_audio_fields(data, message)
    if message.voice:
        data["voice"] = message.voice
    if message.output_sample_rate:
        data["output_sample_rate"] = message.output_sample_rate
    if message.speed:
        data["speed"] = float(message.speed)
    config = _parse(data)
    # The WebSocket finds a bad speed only at the first reply; a config is checked whole.
    _fatal(lambda: check_speed(config.speed))
    return config


def recognition_config(message: pb.RecognitionConfig) -> StreamConfig:
    """A Recognize config: an `asr` session."""
    data: dict[str, Any] = {"mode": "asr"}
    _put_audio_fields(data, message)
    return _parse(data)


def _put_audio_fields(
    data: dict[str, Any], message: pb.StreamConfig | pb.RecognitionConfig
) -> None:
    """Only fields the client set, so the WebSocket's defaults apply to the rest."""
    if message.sample_rate:
        data["sample_rate"] = message.sample_rate
    if message.encoding:
        data["encoding"] = message.encoding
    if message.language:
        data["language"] = message.language
    if message.HasField("partials"):
        data["partials"] = message.partials
    if message.chunk_ms:
        data["chunk_ms"] = message.chunk_ms
    if message.trace_id:
        data["trace_id"] = message.trace_id


def _parse(data: dict[str, Any]) -> StreamConfig:
    return _fatal(lambda: parse_start(data))


T = TypeVar("T")


def _fatal(check: Callable[[], T]) -> T:
    """A config error ends the call, whatever the check thought."""
    try:
        return check()
    except VoxError as exc:
        exc.fatal = True
        raise


# --- requests ------------------------------------------------------------------------------

M = TypeVar("M", bound=Message)


@dataclass(frozen=True, slots=True)
class Undecodable:
    """Request bytes that are not a message of the RPC's type. The servicer is handed this
    instead of grpc answering UNKNOWN "Unexpected DecodeError" without a voxserve code:
    `decoded` refuses it as `invalid_message` (INVALID_ARGUMENT, or an in-stream error)."""

    type_name: str


def request_decoder(message_type: type[M]) -> Callable[[bytes], M | Undecodable]:
    """A request deserializer that never raises (grpc_server registers one per RPC)."""
    name = message_type.DESCRIPTOR.full_name

    def decode(data: bytes) -> M | Undecodable:
        try:
            return message_type.FromString(data)
        except Exception:  # DecodeError; nothing a client sends may escape as UNKNOWN
            return Undecodable(name)

    return decode


def decoded(request: M | Undecodable, *, fatal: bool = False) -> M:
    """The request, or `invalid_message` for bytes that did not decode. Framing is intact
    (grpc delimits messages), so in a stream the next request is read as usual."""
    if isinstance(request, Undecodable):
        raise VoxError(
            ErrorCode.INVALID_MESSAGE,
            f"the request is not a valid {request.type_name} message",
            fatal=fatal,
        )
    return request


def converse_input(
    request: pb.ConverseRequest | Undecodable,
) -> ClientMessage | pb.AudioFrames:
    """One Converse request as the WebSocket's message types (audio stays a proto message)."""
    request = decoded(request)
    kind = request.WhichOneof("request")
    if kind == "audio":
        return request.audio
    if kind == "text":
        return TextMessage(request.text.text, request.text.flush)
    if kind == "end":
        return EndMessage("audio.end")
    if kind == "cancel":
        return CancelMessage()
    if kind == "mark":
        if len(request.mark.id) > MAX_MARK_ID:
            raise VoxError(ErrorCode.INVALID_MESSAGE, "a mark id is at most 64 characters")
        return MarkMessage(request.mark.id)
    if kind == "config":
        raise VoxError(ErrorCode.ALREADY_STARTED, "the session has already started")
    raise VoxError(ErrorCode.INVALID_MESSAGE, "request has none of its fields set")


def frame_bytes(sample_rate: int) -> int:
    """Bytes of one 20 ms PCM16 frame at `sample_rate` (640 at 16 kHz)."""
    return sample_rate * FRAME_MS // 1000 * 2


def split_frames(
    audio: pb.AudioFrames, sample_rate: int, max_frame_ms: int
) -> list[tuple[int, memoryview]]:
    """An audio message as (seq_id, PCM) per 20 ms frame: the first frame has the message's
    seq_id, the next ones the ids after it, so resends dedup frame by frame. A short last
    frame is allowed. Errors use the WebSocket's codes for the same faults. No copies."""
    pcm = memoryview(audio.pcm)
    size = len(pcm)
    if size == 0:
        raise VoxError(ErrorCode.EMPTY_AUDIO, "audio message carries no samples")
    limit = sample_rate * max_frame_ms // 1000 * 2
    if size > limit:
        raise VoxError(
            ErrorCode.FRAME_TOO_LARGE,
            f"audio message of {size} bytes exceeds {max_frame_ms} ms at {sample_rate} Hz",
        )
    if size % 2:
        raise VoxError(ErrorCode.ODD_LENGTH_PCM, f"PCM16 payload has odd length {size}")
    step = frame_bytes(sample_rate)
    seq = audio.seq_id
    return [
        ((seq + i) % SEQ_MOD, pcm[start : start + step])
        for i, start in enumerate(range(0, size, step))
    ]


# --- events --------------------------------------------------------------------------------

Filler = Callable[[Any, dict[str, Any]], None]


def _started(m: pb.SessionStarted, e: dict[str, Any]) -> None:
    m.session_id = str(e.get("session_id", ""))
    m.trace_id = str(e.get("trace_id", ""))
    m.mode = _MODE_ENUM.get(str(e.get("mode")), pb.MODE_UNSPECIFIED)  # type: ignore[assignment]
    m.sample_rate = int(e.get("sample_rate", 0))
    m.encoding = str(e.get("encoding", ""))
    m.language = str(e.get("language") or "")
    m.voice = str(e.get("voice") or "")
    m.output_sample_rate = int(e.get("output_sample_rate", 0))
    m.frame_ms = int(e.get("frame_ms", FRAME_MS))


def _vad_start(m: pb.VadStart, e: dict[str, Any]) -> None:
    m.segment = int(e["segment"])
    m.start_ms = _ms(e.get("start_ms"))


def _vad_end(m: pb.VadEnd, e: dict[str, Any]) -> None:
    m.segment = int(e["segment"])
    m.start_ms = _ms(e.get("start_ms"))
    m.end_ms = _ms(e.get("end_ms"))


def _transcript(final: bool) -> Filler:
    def fill(m: pb.Transcript, e: dict[str, Any]) -> None:
        m.segment = int(e["segment"])
        m.text = str(e.get("text", ""))
        m.is_final = final
        m.start_ms = _ms(e.get("start_ms"))
        m.end_ms = _ms(e.get("end_ms"))
        m.language = str(e.get("language") or "")

    return fill


def _response_text(m: pb.ResponseText, e: dict[str, Any]) -> None:
    m.reply = int(e["reply"])
    m.text = str(e.get("text", ""))


def _tts_start(m: pb.TtsStart, e: dict[str, Any]) -> None:
    m.reply = int(e["reply"])
    m.voice = str(e.get("voice", ""))
    m.sample_rate = int(e.get("sample_rate", 0))
    m.encoding = str(e.get("encoding", ""))


def _tts_end(m: pb.TtsEnd, e: dict[str, Any]) -> None:
    m.reply = int(e["reply"])
    m.chunks = int(e.get("chunks", 0))
    m.audio_ms = _ms(e.get("audio_ms"))
    m.interrupted = bool(e.get("interrupted", False))
    m.played_ms = _ms(e.get("played_ms"))


def _barge_in(m: pb.BargeIn, e: dict[str, Any]) -> None:
    m.segment = int(e["segment"])


def _mark(m: pb.Mark, e: dict[str, Any]) -> None:
    m.id = str(e.get("id", ""))


def _error(m: pb.Error, e: dict[str, Any]) -> None:
    m.code = str(e.get("code", ""))
    m.message = str(e.get("message", ""))
    m.fatal = bool(e.get("fatal", False))
    m.stage = str(e.get("stage") or "")
    if e.get("segment") is not None:
        m.segment = int(e["segment"])
    if e.get("reply") is not None:
        m.reply = int(e["reply"])


_COUNTERS = (
    "received",
    "duplicates",
    "accepted",
    "processed",
    "dropped",
    "rejected",
    "gaps",
    "reordered",
    "segments",
    "replies",
    "interrupted",
    "duration_ms",
)


def _ended(m: pb.SessionEnded, e: dict[str, Any]) -> None:
    m.session_id = str(e.get("session_id", ""))
    m.trace_id = str(e.get("trace_id", ""))
    m.reason = str(e.get("reason", ""))
    for name in _COUNTERS:
        setattr(m, name, max(0, int(e.get(name, 0))))


def _ms(value: object) -> int:
    """Milliseconds as the proto's unsigned field (events carry ints; be lenient)."""
    if isinstance(value, int | float) and value > 0:
        return int(value)
    return 0


EVENT_FIELDS: dict[str, tuple[str, Filler]] = {
    "session.started": ("started", _started),
    "vad.start": ("vad_start", _vad_start),
    "vad.end": ("vad_end", _vad_end),
    "transcript.partial": ("transcript", _transcript(False)),
    "transcript.final": ("transcript", _transcript(True)),
    "response.delta": ("response_delta", _response_text),
    "response.text": ("response_text", _response_text),
    "tts.start": ("tts_start", _tts_start),
    "tts.end": ("tts_end", _tts_end),
    "barge_in": ("barge_in", _barge_in),
    "mark": ("mark", _mark),
    "error": ("error", _error),
    "session.ended": ("ended", _ended),
}
"""Each WebSocket event type -> (oneof field of the response, function that fills it)."""

R = TypeVar("R", pb.ConverseResponse, pb.RecognizeResponse)


def encode_event(event: dict[str, Any], response_type: type[R]) -> R | None:
    """The response carrying `event`, or None when this response type has no such field
    (a Recognize stream has no reply events) or the event type is unknown."""
    found = EVENT_FIELDS.get(str(event.get("type")))
    if found is None:
        return None
    field, fill = found
    if field not in response_type.DESCRIPTOR.fields_by_name:
        return None
    response = response_type()
    fill(getattr(response, field), event)
    return response


def encode_audio(pcm: bytes, reply: int) -> pb.ConverseResponse:
    """Reply audio (the WebSocket's binary message) with the reply it belongs to."""
    response = pb.ConverseResponse()
    response.audio.reply = reply
    response.audio.pcm = pcm
    return response


def mode_enum(mode: str) -> int:
    return _MODE_ENUM.get(mode, pb.MODE_UNSPECIFIED)

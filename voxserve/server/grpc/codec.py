"""voxserve.v1 requests -> the protocol's values (configs, client messages, audio frames), and
VoxError -> gRPC status, as pure functions (no I/O, no server), so every mapping is
unit-tested and fuzzable apart from a call. Events go the other way in grpc/events.py.

Configs are turned into the WebSocket's `session.start` dict and validated by the same
`parse_start`, so both transports accept and refuse exactly the same values with the same
codes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from voxserve.errors import ErrorCode, VoxError, shortened
from voxserve.events import (
    CancelMessage,
    ClientMessage,
    EndMessage,
    MarkMessage,
    Mode,
    StreamConfig,
    TextMessage,
)
from voxserve.pipeline.synthesis.request import check_speed
from voxserve.server.grpc.events import MODE_ENUM
from voxserve.server.session.stream_protocol import fatal, parse_start
from voxserve.types import FRAME_MS
from voxserve.v1 import voxserve_pb2 as pb

ERROR_CODE_KEY = "voxserve-error-code"
"""Trailing metadata key holding the voxserve code of a call that ended with an error."""
TRACE_ID_KEY = "voxserve-trace-id"
TRACE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
"""A client's trace id, as session.start takes one (ws_protocol.parse_start): it is echoed in
metadata, where a control or non-ASCII character fails the call in grpc itself (INTERNAL
"Invalid metadata", the voxserve code lost) and a long one takes the metadata's room."""
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
    ErrorCode.UNKNOWN_WAKE_WORD: S.INVALID_ARGUMENT,
    ErrorCode.UNKNOWN_MODEL: S.INVALID_ARGUMENT,
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
    # conversation sessions (the Realtime API) only; listed for completeness
    ErrorCode.RESPONSE_ACTIVE: S.FAILED_PRECONDITION,
    ErrorCode.RESPONSE_NOT_ACTIVE: S.FAILED_PRECONDITION,
    ErrorCode.TOO_MANY_TOOL_CALLS: S.RESOURCE_EXHAUSTED,
    # WebRTC calls (HTTP) only; listed for completeness
    ErrorCode.INVALID_SDP: S.INVALID_ARGUMENT,
    ErrorCode.CALL_NOT_FOUND: S.NOT_FOUND,
    ErrorCode.WEBRTC_UNAVAILABLE: S.UNIMPLEMENTED,
    ErrorCode.STAGE_TIMEOUT: S.DEADLINE_EXCEEDED,
    # HTTP says 502 (a dependency failed); gRPC's equivalent is UNAVAILABLE: retry may help.
    ErrorCode.ENGINE_ERROR: S.UNAVAILABLE,
    ErrorCode.ENGINE_UNAVAILABLE: S.UNAVAILABLE,
    ErrorCode.OVERLOADED: S.RESOURCE_EXHAUSTED,
    ErrorCode.QUOTA_EXCEEDED: S.RESOURCE_EXHAUSTED,
    ErrorCode.IDLE_TIMEOUT: S.DEADLINE_EXCEEDED,
    ErrorCode.SESSION_EXPIRED: S.DEADLINE_EXCEEDED,
    ErrorCode.NOT_READY: S.UNAVAILABLE,
    ErrorCode.MODEL_UNAVAILABLE: S.UNAVAILABLE,
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
    "wyoming_limit": S.RESOURCE_EXHAUSTED,  # Wyoming only
    "host_not_allowed": S.PERMISSION_DENIED,
    "session_too_large": S.INVALID_ARGUMENT,  # client secrets (HTTP) only
    "storage_unavailable": S.UNAVAILABLE,
    "model_not_found": S.NOT_FOUND,  # /admin/models (HTTP) only
    "model_not_removable": S.FAILED_PRECONDITION,  # /admin/models (HTTP) only
}

_MODES: dict[int, Mode] = {value: name for name, value in MODE_ENUM.items()}


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
    if trace_id and TRACE_ID.fullmatch(trace_id):  # never one that is not valid metadata
        items.append((TRACE_ID_KEY, trace_id))
    retry_s = getattr(error, "retry_after_s", None)
    if retry_s is not None:
        items.append((RETRY_AFTER_KEY, str(int(retry_s * 1000))))
    elif error.code in (ErrorCode.OVERLOADED, ErrorCode.NOT_READY):
        items.append((RETRY_AFTER_KEY, "1000"))
    return tuple(items)


def trace_id_of(given: str) -> str | None:
    """A request's `trace_id` field (Synthesize): None when not given; `invalid_message`
    when it is not 1-64 characters of A-Z a-z 0-9 _ . : - (as session.start's, which the
    session RPCs take through parse_start)."""
    if not given:
        return None
    if TRACE_ID.fullmatch(given) is None:
        raise VoxError(
            ErrorCode.INVALID_MESSAGE, "trace_id must be 1-64 characters of A-Z a-z 0-9 _ . : -"
        )
    return given


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
    if message.HasField("turn_detection"):
        td = message.turn_detection
        turns: dict[str, Any] = {"type": td.type}
        if td.eagerness:
            turns["eagerness"] = td.eagerness
        if td.silence_duration_ms:
            turns["silence_duration_ms"] = td.silence_duration_ms
        data["turn_detection"] = turns
    config = _parse(data)
    # The WebSocket finds a bad speed only at the first reply; a config is checked whole.
    fatal(lambda: check_speed(config.speed))
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
    return fatal(lambda: parse_start(data))


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

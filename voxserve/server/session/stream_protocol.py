"""The /v1/stream wire format as pure functions: bytes/str in, typed messages or VoxError out.

No I/O here, so every parser can be unit-tested and fuzzed without a socket. The
connection's link (websocket/link.py) decodes with these, and the session driver maps the messages
onto a Session (session_input.apply_control). The messages and events themselves are the
protocol's vocabulary (voxserve/events.py); this is their JSON form.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any, TypeVar, cast

import msgspec

from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.events import (
    EAGERNESS,
    MODES,
    TURN_TYPES,
    CancelMessage,
    ClientMessage,
    CreditMessage,
    Eagerness,
    EndMessage,
    MarkMessage,
    ResumeMessage,
    ServerEvent,
    StartMessage,
    StreamConfig,
    TextMessage,
    TurnDetection,
    TurnUpdate,
)
from voxserve.server.session import fields as f
from voxserve.server.session.fields import SILENCE_MS
from voxserve.server.session.json_input import DEFAULT_MAX_DEPTH, as_float, decode_json
from voxserve.types import SEQ_HEADER_BYTES, SUPPORTED_INPUT_RATES, SUPPORTED_OUTPUT_RATES

ENCODINGS = ("pcm_s16le",)
ENCODING_ALIASES = {"pcm_s16le": "pcm_s16le", "pcm16": "pcm_s16le", "s16le": "pcm_s16le"}
_TRACE_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_CHUNK_MS_RANGE = (160, 4000)


MAX_CREDIT_MS = 60_000
MARK_INT_LIMIT = 1 << 63  # echoed back: no 4,000-digit integers
_SESSION_ID = re.compile(r"^[0-9a-f]{16}$")
SEQ_MAX = (1 << 32) - 1


def _invalid(message: str) -> VoxError:
    return VoxError(ErrorCode.INVALID_MESSAGE, message)


def _field(data: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = data.get(name, default)
    if value is None:  # JSON null is "not given": the default (found by tests/fuzz)
        return default
    if value is default:
        return value
    # bool is an int in Python; refuse true/false where a number is expected.
    if isinstance(value, bool) and kind is not bool:
        raise _invalid(f"field {name!r} must be {_kind_name(kind)}")
    if not isinstance(value, kind):
        raise _invalid(f"field {name!r} must be {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)


_MAX_MODEL = 200  # a model name or alias (config.ModelsConfig)


def parse_start(data: dict[str, Any]) -> StreamConfig:
    mode = data.get("mode")
    if mode not in MODES:
        raise VoxError(
            ErrorCode.UNKNOWN_MODE,
            f"mode {quoted(mode)} is not one of {', '.join(MODES)}",
            fatal=True,
        )
    rate = _field(data, "sample_rate", int, 16_000)
    if rate not in SUPPORTED_INPUT_RATES:
        raise VoxError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"sample_rate {quoted(rate)} is not supported; use one of "
            + ", ".join(map(str, SUPPORTED_INPUT_RATES)),
            fatal=True,
        )
    encoding_in = _field(data, "encoding", str, "pcm_s16le")
    encoding = ENCODING_ALIASES.get(encoding_in.lower())
    if encoding is None:
        raise VoxError(
            ErrorCode.UNSUPPORTED_ENCODING,
            f"encoding {quoted(encoding_in)} is not supported; use {', '.join(ENCODINGS)}",
            fatal=True,
        )
    out_rate = _field(data, "output_sample_rate", int, None)
    if out_rate is not None and out_rate not in SUPPORTED_OUTPUT_RATES:
        raise VoxError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"output_sample_rate {quoted(out_rate)} is not supported; use one of "
            + ", ".join(map(str, SUPPORTED_OUTPUT_RATES)),
            fatal=True,
        )
    speed = as_float(_field(data, "speed", (int, float), 1.0), "speed")
    chunk_ms = _field(data, "chunk_ms", int, None)
    if chunk_ms is not None and not _CHUNK_MS_RANGE[0] <= chunk_ms <= _CHUNK_MS_RANGE[1]:
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            f"chunk_ms must be between {_CHUNK_MS_RANGE[0]} and {_CHUNK_MS_RANGE[1]}",
            fatal=True,
        )
    trace_id = _field(data, "trace_id", str, None)
    if trace_id is None:
        trace_id = uuid.uuid4().hex
    elif not _TRACE_ID.match(trace_id):
        raise _invalid("trace_id must be 1-64 characters of A-Z a-z 0-9 _ . : -")
    wake_word = _field(data, "wake_word", str, None)
    if wake_word is not None and mode == "tts":
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            "wake_word needs an audio mode (asr or assistant)",
            fatal=True,
        )
    model = _field(data, "model", str, None)
    if model is not None and (mode == "tts" or not 0 < len(model) <= _MAX_MODEL):
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            f"model (the ASR model) needs an audio mode and 1-{_MAX_MODEL} characters",
            fatal=True,
        )
    return StreamConfig(
        mode=mode,
        sample_rate=rate,
        encoding=encoding,
        language=_field(data, "language", str, None),
        voice=_field(data, "voice", str, None),
        output_sample_rate=out_rate,
        speed=speed,
        partials=_field(data, "partials", bool, None),
        chunk_ms=chunk_ms,
        trace_id=trace_id,
        resumable=bool(_field(data, "resumable", bool, False)),
        wake_word=wake_word,
        turn_detection=_start_turns(data.get("turn_detection")),
        model=model,
    )


def _start_turns(value: object) -> TurnDetection | None:
    """session.start's errors end the connection."""
    return None if value is None else fatal(lambda: parse_turn_detection(value))


T = TypeVar("T")


def fatal(check: Callable[[], T]) -> T:
    """A config error ends the session (the connection, the call), whatever the check
    thought."""
    try:
        return check()
    except VoxError as exc:
        exc.fatal = True
        raise


def parse_turn_detection(value: object, path: str = "turn_detection") -> TurnDetection:
    """`{"type": "server_vad", "silence_duration_ms": N}` or `{"type": "semantic_vad",
    "eagerness": "low"|"medium"|"high"|"auto"}` (docs/protocol.md): invalid_message for a
    missing or ill-typed field, invalid_parameter for a value out of range or a field the
    type does not take, naming it."""
    if not isinstance(value, dict):
        raise _invalid(f"{path} must be an object")
    kind = f.choice(value, "type", path, TURN_TYPES)
    if kind is None:
        raise _invalid(f"{path}.type is required: server_vad or semantic_vad")
    fields = ("type", "eagerness") if kind == "semantic_vad" else ("type", "silence_duration_ms")
    for key in value:
        if key not in fields:
            raise f.bad_value(
                f"{path}.{key}", f"is not a {kind} field; its fields: {', '.join(fields)}"
            )
    if kind == "semantic_vad":
        eagerness = f.choice(value, "eagerness", path, EAGERNESS) or "auto"
        return TurnDetection(type="semantic_vad", eagerness=cast(Eagerness, eagerness))
    silence = f.integer(value, "silence_duration_ms", path, *SILENCE_MS)
    return TurnDetection(type="server_vad", silence_duration_ms=silence)


def parse_text_message(
    raw: str, max_bytes: int, max_depth: int = DEFAULT_MAX_DEPTH
) -> ClientMessage:
    """Decode one JSON control message (size, depth and text checked: json_input)."""
    data = decode_json(raw, max_bytes=max_bytes, max_depth=max_depth, what="control message")
    if not isinstance(data, dict):
        raise VoxError(ErrorCode.INVALID_JSON, "control message must be a JSON object")
    kind = data.get("type")
    if kind == "session.start":
        return StartMessage(parse_start(data))
    if kind == "text":
        text = data.get("text")
        if not isinstance(text, str):
            raise _invalid("field 'text' must be a string")
        flush = _field(data, "flush", bool, False)
        return TextMessage(text, bool(flush))
    if kind in ("audio.end", "session.end"):
        return EndMessage(kind)
    if kind == "cancel":
        return CancelMessage()
    if kind == "mark":
        mark_id = data.get("id")
        if isinstance(mark_id, bool) or not isinstance(mark_id, str | int):
            raise _invalid("field 'id' of a mark must be a string or an integer")
        if isinstance(mark_id, str) and len(mark_id) > 64:
            raise _invalid("a mark id is at most 64 characters")
        if isinstance(mark_id, int) and not -MARK_INT_LIMIT <= mark_id < MARK_INT_LIMIT:
            raise _invalid("an integer mark id is a signed 64-bit integer")
        return MarkMessage(mark_id)
    if kind == "credit":
        audio_ms = _field(data, "audio_ms", int, None)
        if audio_ms is None or not 1 <= audio_ms <= MAX_CREDIT_MS:
            raise _invalid(f"field 'audio_ms' of a credit must be 1 to {MAX_CREDIT_MS}")
        return CreditMessage(audio_ms)
    if kind == "session.resume":
        return parse_resume(data)
    if kind == "session.update":
        extra = sorted(set(data) - {"type", "turn_detection"})
        if extra or "turn_detection" not in data:
            raise f.bad_value(
                extra[0] if extra else "turn_detection",
                "session.update on /v1/stream changes turn_detection only"
                if extra
                else "is required in session.update",
            )
        return TurnUpdate(parse_turn_detection(data["turn_detection"]))
    if not isinstance(kind, str):
        raise _invalid("control message needs a string field 'type'")
    raise _invalid(f"unknown message type {quoted(kind)}")


def parse_resume(data: dict[str, Any]) -> ResumeMessage:
    """As the first message, its errors are fatal (the connection's rule for a first
    message); later, a `session.resume` is refused like any other bad message."""
    session_id = _field(data, "session_id", str, None)
    if session_id is None or not _SESSION_ID.match(session_id):
        raise VoxError(
            ErrorCode.INVALID_MESSAGE,
            "session.resume needs the 'session_id' of session.started",
        )
    last_seq = _field(data, "last_seq", int, None)
    if last_seq is not None and not 0 <= last_seq <= SEQ_MAX:
        raise VoxError(ErrorCode.INVALID_MESSAGE, "last_seq must be a 32-bit seq_id")
    return ResumeMessage(session_id, last_seq)


def max_frame_bytes(sample_rate: int, max_frame_ms: int) -> int:
    return SEQ_HEADER_BYTES + sample_rate * max_frame_ms // 1000 * 2


def parse_audio_frame(
    data: bytes, sample_rate: int, max_frame_ms: int, limit: int | None = None
) -> tuple[int, memoryview]:
    """Split a binary message into (seq_id, PCM view). The PCM is not copied. `limit`:
    max_frame_bytes(sample_rate, max_frame_ms), for a caller that parses every frame."""
    if len(data) < SEQ_HEADER_BYTES:
        raise VoxError(
            ErrorCode.FRAME_TOO_SHORT,
            f"audio message of {len(data)} bytes is shorter than its 4-byte seq_id header",
        )
    if limit is None:
        limit = max_frame_bytes(sample_rate, max_frame_ms)
    if len(data) > limit:
        raise VoxError(
            ErrorCode.FRAME_TOO_LARGE,
            f"audio message of {len(data)} bytes exceeds {max_frame_ms} ms at {sample_rate} Hz",
        )
    pcm = memoryview(data)[SEQ_HEADER_BYTES:]
    if len(pcm) == 0:
        raise VoxError(ErrorCode.EMPTY_AUDIO, "audio message carries no samples")
    if len(pcm) % 2:
        raise VoxError(ErrorCode.ODD_LENGTH_PCM, f"PCM16 payload has odd length {len(pcm)}")
    return int.from_bytes(data[:SEQ_HEADER_BYTES], "big"), pcm


_encode_json = msgspec.json.Encoder().encode


def encode_event(event: ServerEvent) -> str:
    """An event as the text of one message: its `type` first, then its fields in their
    declared order, UNSET ones left out; the same text `json.dumps(..., separators=(",",
    ":"), ensure_ascii=False)` made of the dicts events once were. UnicodeEncodeError (a
    ValueError) here, before anything is written, if it holds text that cannot be sent as
    UTF-8 (a lone surrogate)."""
    return _encode_json(event).decode()

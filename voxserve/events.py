"""The /v1/stream protocol's vocabulary: every server event and every client control message
as a typed value. docs/protocol.md lists the same names and fields (tests/test_events_docs.py
holds the two together).

Server events are msgspec Structs, tagged with their wire `type`: the session's hot path
builds one per partial, credit change and mark, and constructing plus JSON-encoding one costs
~1/10 of the dict + `json.dumps` it replaced (scripts/bench_events.py). A field that the wire
leaves out unless it applies (`played_ms`, an error's `reply`, ...) defaults to UNSET, which
the encoders omit; a field that is null on the wire (`credit_window` in `tts` mode) is None.
Fields are declared in the order the wire has always sent them.

Client messages are frozen dataclasses: they are made by the validating parsers
(server/ws_protocol.py, server/grpc_codec.py), not encoded, so speed does not decide there.

Each wire has one encoder: JSON for the WebSocket (`ws_protocol.encode_event`), protobuf for
gRPC (`grpc_events.encode_event`, an exhaustive match that says which events voxserve.v1
cannot carry). Wyoming does not carry these events at all: it calls the pipeline per request
(transcribe, synthesize) and answers with Wyoming's own events (server/wyoming_handler.py).

Bottom layer: imports only the standard library and msgspec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

import msgspec
from msgspec import UNSET as UNSET  # re-exported: callers test optional fields against it
from msgspec import UnsetType as UnsetType

Mode = Literal["asr", "tts", "assistant"]
MODES: tuple[Mode, ...] = ("asr", "tts", "assistant")


# --- client messages --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """What `session.start` asked for, validated (voice/language are checked against the
    loaded engines by the session). gRPC's StreamConfig/RecognitionConfig map onto it."""

    mode: Mode
    sample_rate: int = 16_000
    encoding: str = "pcm_s16le"
    language: str | None = None
    voice: str | None = None
    output_sample_rate: int | None = None
    speed: float = 1.0
    partials: bool | None = None
    chunk_ms: int | None = None  # how often a partial transcript is re-decoded
    trace_id: str = ""
    # The client can reconnect with `session.resume` (WebSocket): if it drops, the session
    # is kept limits.resume_window_s instead of ending (its accepted audio still finishes).
    resumable: bool = False


@dataclass(frozen=True, slots=True)
class StartMessage:
    """`session.start`: its fields are the config's."""

    config: StreamConfig


@dataclass(frozen=True, slots=True)
class TextMessage:
    text: str
    flush: bool = False


@dataclass(frozen=True, slots=True)
class EndMessage:
    """`audio.end` or `session.end`: no more input; finish what is pending, then close."""

    kind: str


@dataclass(frozen=True, slots=True)
class CancelMessage:
    """Barge-in from the client: stop the reply now."""


@dataclass(frozen=True, slots=True)
class MarkMessage:
    """Echoed back as `mark` once everything sent before it has been handled."""

    id: str | int


@dataclass(frozen=True, slots=True)
class CreditMessage:
    """Output credit: the client may play `audio_ms` more of reply audio (speaker.py)."""

    audio_ms: int


@dataclass(frozen=True, slots=True)
class ResumeMessage:
    """First message of a reconnect: continue a parked session (limits.resume_window_s)."""

    session_id: str
    last_seq: int | None


ClientMessage: TypeAlias = (
    StartMessage
    | TextMessage
    | EndMessage
    | CancelMessage
    | MarkMessage
    | CreditMessage
    | ResumeMessage
)

CLIENT_MESSAGE_TYPES: dict[str, type[ClientMessage]] = {
    "session.start": StartMessage,
    "session.resume": ResumeMessage,
    "text": TextMessage,
    "audio.end": EndMessage,
    "session.end": EndMessage,
    "cancel": CancelMessage,
    "mark": MarkMessage,
    "credit": CreditMessage,
}
"""Each client `type` and the message ws_protocol.parse_text_message parses it into; the
parser does not read this table: tests/test_events_docs.py holds it to docs/protocol.md."""


# --- server events ----------------------------------------------------------------------


class Event(msgspec.Struct, frozen=True, gc=False, tag_field="type"):
    """Base of every server event. gc=False: events hold only scalars (no cycles), so the
    collector need not track the thousands a busy server makes each second."""


class SessionStarted(Event, frozen=True, tag="session.started"):
    session_id: str
    trace_id: str
    mode: Mode
    sample_rate: int
    encoding: str
    language: str
    voice: str
    output_sample_rate: int
    frame_ms: int  # FRAME_MS
    credit_window: int | None  # the input window now; null in `tts` mode
    resumable: bool


class SessionResumed(Event, frozen=True, tag="session.resumed"):
    """The answer to `session.resume`: the client resends audio after `acked_seq`."""

    session_id: str
    trace_id: str
    acked_seq: int | None
    credit_window: int | None


class SessionEnded(Event, frozen=True, tag="session.ended"):
    """The session's counters (nothing accepted is dropped silently); the last event."""

    session_id: str
    trace_id: str
    reason: str  # completed, server_shutdown, or the fatal error's code
    received: int
    duplicates: int
    accepted: int
    processed: int
    dropped: int
    rejected: int
    gaps: int
    reordered: int
    segments: int
    replies: int
    interrupted: int
    duration_ms: int


class VadStart(Event, frozen=True, tag="vad.start"):
    segment: int
    start_ms: int


class VadEnd(Event, frozen=True, tag="vad.end"):
    segment: int
    start_ms: int
    end_ms: int


class TranscriptPartial(Event, frozen=True, tag="transcript.partial"):
    """Replaceable; never sent after its segment's final."""

    segment: int
    text: str
    start_ms: int
    end_ms: int


class TranscriptFinal(Event, frozen=True, tag="transcript.final"):
    segment: int
    text: str
    start_ms: int
    end_ms: int
    language: str


class ResponseDelta(Event, frozen=True, tag="response.delta"):
    reply: int
    text: str


class ResponseText(Event, frozen=True, tag="response.text"):
    reply: int
    text: str


class TtsStart(Event, frozen=True, tag="tts.start"):
    reply: int
    voice: str
    sample_rate: int
    encoding: str = "pcm_s16le"


class TtsEnd(Event, frozen=True, tag="tts.end"):
    reply: int
    chunks: int
    audio_ms: int
    interrupted: bool
    underruns: int
    played_ms: int | UnsetType = UNSET  # an estimate, sent only when interrupted


class TtsFallback(Event, frozen=True, tag="tts.fallback"):
    """TTS is degraded: the reply speaks the fallback phrase `text` instead."""

    reply: int
    reason: str  # slow | queue
    text: str


class BargeIn(Event, frozen=True, tag="barge_in"):
    segment: int


class Mark(Event, frozen=True, tag="mark"):
    """The client's mark, echoed in order. `acked_seq` in audio modes while input is open."""

    id: str | int
    acked_seq: int | UnsetType | None = UNSET


class Credit(Event, frozen=True, tag="credit"):
    """The stream's input window changed."""

    window: int
    acked_seq: int | None


class ErrorEvent(Event, frozen=True, tag="error"):
    """A VoxError as the client reads it (VoxError.to_event); named so as not to read as an
    exception. The optional fields are sent where they apply."""

    code: str
    message: str
    fatal: bool
    stage: str | UnsetType = UNSET
    retry_after_ms: int | UnsetType = UNSET
    segment: int | UnsetType = UNSET
    reply: int | UnsetType = UNSET
    trace_id: str | UnsetType = UNSET


ServerEvent: TypeAlias = (
    SessionStarted
    | SessionResumed
    | SessionEnded
    | VadStart
    | VadEnd
    | TranscriptPartial
    | TranscriptFinal
    | ResponseDelta
    | ResponseText
    | TtsStart
    | TtsEnd
    | TtsFallback
    | BargeIn
    | Mark
    | Credit
    | ErrorEvent
)


def event_type(event: Event) -> str:
    """The wire `type` of an event (its tag), e.g. for a log line."""
    return str(event.__struct_config__.tag)

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
(server/session/stream_protocol.py, server/grpc/codec.py), not encoded, so speed does not
decide there.

Each wire has one encoder: JSON for the WebSocket (`ws_protocol.encode_event`), protobuf for
gRPC (`grpc_events.encode_event`, an exhaustive match that says which events voxserve.v1
cannot carry). Wyoming does not carry these events: a transcription turns the partials and
finals of its session into Wyoming's transcript events (server/wyoming/stt.py), speech is
answered with Wyoming's audio events (server/wyoming/handler.py).

Bottom layer: imports only the standard library and msgspec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

import msgspec
from msgspec import UNSET as UNSET  # re-exported: callers test optional fields against it
from msgspec import UnsetType as UnsetType

Mode = Literal["asr", "tts", "assistant"]
TurnType = Literal["server_vad", "semantic_vad"]
Eagerness = Literal["low", "medium", "high", "auto"]
TURN_TYPES: tuple[TurnType, ...] = ("server_vad", "semantic_vad")
EAGERNESS: tuple[Eagerness, ...] = ("low", "medium", "high", "auto")
MODES: tuple[Mode, ...] = ("asr", "tts", "assistant")


# --- client messages --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the responder may call (the Realtime API's `tools` entry)."""

    name: str
    description: str = ""
    parameters: dict[str, object] | None = None  # a JSON schema, passed through as given


@dataclass(frozen=True, slots=True)
class ResponseOptions:
    """How a conversation session answers: its defaults (`ConversationConfig.response`),
    or one response's overrides (`ResponseCreate`), where None means "the default"."""

    instructions: str | None = None  # the responder's system prompt; None: its own
    tools: tuple[ToolSpec, ...] | None = None
    tool_choice: str | None = None  # auto | none | required | a function's name
    output_modalities: tuple[Literal["audio", "text"], ...] | None = None  # audio: text + speech
    voice: str | None = None  # an installed voice id
    max_output_tokens: int | None = None
    # False: an out-of-band response (conversation "none"): answered, not kept in history.
    in_conversation: bool = True
    voice_name: str | None = None  # `voice` as the client named it (alloy): reported back
    # The client's key/value pairs (response.create's `metadata`), echoed on the response.
    metadata: tuple[tuple[str, str], ...] | None = None


@dataclass(frozen=True, slots=True)
class TurnDetection:
    """Turn detection of a session; None in ConversationConfig is push-to-talk
    (no VAD: audio between commits is one utterance). None fields: the server's setting.
    `server_vad` ends a turn after a fixed silence; `semantic_vad` adapts the silence to
    what was said (pipeline/turns/endpointing.py), as eager as `eagerness` says."""

    threshold: float | None = None  # speech probability (vad.threshold)
    prefix_padding_ms: int | None = None  # audio kept before speech start (vad.pad_ms)
    silence_duration_ms: int | None = None  # silence that ends a turn (vad.hangover_ms)
    create_response: bool = True  # answer each committed turn
    interrupt_response: bool = True  # speech cancels the response in progress
    type: TurnType = "server_vad"
    eagerness: Eagerness = "auto"  # semantic_vad only


@dataclass(frozen=True, slots=True)
class ConversationConfig:
    """A conversation session (the Realtime API): the conversation's items are kept, turns
    are committed by VAD or by the client, responses come when a turn ends or on request,
    and the responder may call tools. /v1/stream sessions have none."""

    responds: bool = True  # Realtime type "realtime"; False: "transcription", no responses
    turn_detection: TurnDetection | None = TurnDetection()
    transcribe: bool = True  # input transcription events (item's transcript)
    response: ResponseOptions = ResponseOptions(output_modalities=("audio",))


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
    # Conversation sessions only (the Realtime API; mode "assistant"): see ConversationConfig.
    conversation: ConversationConfig | None = None
    # /v1/stream audio modes: ASR waits for this wake word (a pymicro-wakeword model name),
    # then takes one turn, then waits again (pipeline/turns/wake_gate.py). None: no wake word.
    wake_word: str | None = None
    # /v1/stream and gRPC (asr, assistant): None is the server's (vad.turn_detection).
    turn_detection: TurnDetection | None = None
    # The ASR model by name (a [models] entry or alias; None: the default), chosen once at
    # session start (/v1/stream `model`, Realtime `audio.input.transcription.model`).
    model: str | None = None


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


# Conversation sessions only (the Realtime API's client events; /v1/stream has none of them).


@dataclass(frozen=True, slots=True)
class SessionUpdate:
    """`session.update`: the whole new config (the codec merges the client's partial update
    into the one it holds). The session applies what changed, or refuses with a code what
    cannot change now (server/realtime_api/codec.py; pipeline/session.py)."""

    config: StreamConfig


@dataclass(frozen=True, slots=True)
class CommitAudio:
    """`input_audio_buffer.commit`: the audio since the last commit is a user turn now."""


@dataclass(frozen=True, slots=True)
class ClearAudio:
    """`input_audio_buffer.clear`: forget the audio not yet committed."""


ItemKind = Literal["message", "function_call", "function_call_output"]
Role = Literal["user", "assistant", "system"]


@dataclass(frozen=True, slots=True)
class CreateItem:
    """`conversation.item.create`: a message (its text parts joined), a function call, or a
    function call's output, inserted after `previous_item_id` (None: at the end)."""

    kind: ItemKind
    item_id: str | None = None  # the client's id, else the session assigns one
    previous_item_id: str | None = None
    role: Role | None = None  # messages
    text: str = ""  # messages
    call_id: str | None = None  # function_call, function_call_output
    name: str | None = None  # function_call
    arguments: str = ""  # function_call: JSON text
    output: str = ""  # function_call_output


@dataclass(frozen=True, slots=True)
class DeleteItem:
    item_id: str


@dataclass(frozen=True, slots=True)
class TruncateItem:
    """An assistant item's audio was heard only up to `audio_end_ms`: its transcript is cut
    to what was spoken by then."""

    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class CreateResponse:
    """`response.create`: answer now, with these overrides of the session's defaults."""

    options: ResponseOptions = ResponseOptions()


@dataclass(frozen=True, slots=True)
class TurnUpdate:
    """`session.update` on /v1/stream (and gRPC): new turn detection, from this point of
    the audio on (the turn in progress goes on under it)."""

    turn_detection: TurnDetection


StreamMessage: TypeAlias = (
    StartMessage
    | TurnUpdate
    | TextMessage
    | EndMessage
    | CancelMessage
    | MarkMessage
    | CreditMessage
    | ResumeMessage
)
"""What a /v1/stream client sends (docs/protocol.md)."""

ConversationMessage: TypeAlias = (
    SessionUpdate
    | CommitAudio
    | ClearAudio
    | CreateItem
    | DeleteItem
    | TruncateItem
    | CreateResponse
)
"""What only a conversation session takes (the Realtime API's codec makes them)."""

ClientMessage: TypeAlias = StreamMessage | ConversationMessage

CLIENT_MESSAGE_TYPES: dict[str, type[ClientMessage]] = {
    "session.start": StartMessage,
    "session.resume": ResumeMessage,
    "text": TextMessage,
    "audio.end": EndMessage,
    "session.end": EndMessage,
    "cancel": CancelMessage,
    "mark": MarkMessage,
    "credit": CreditMessage,
    "session.update": TurnUpdate,
}
"""Each client `type` and the message ws_protocol.parse_text_message parses it into; the
parser does not read this table: tests/test_events_docs.py holds it to docs/protocol.md."""


# --- server events ----------------------------------------------------------------------


class Event(msgspec.Struct, frozen=True, gc=False, tag_field="type"):
    """Base of every server event. gc=False: events hold only scalars (no cycles), so the
    collector need not track the thousands a busy server makes each second."""


class TurnDetectionInfo(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """A session's turn detection as it is in force (session.started, session.updated)."""

    type: TurnType
    eagerness: Eagerness | None = None  # semantic_vad
    silence_duration_ms: int | None = None  # server_vad


AUTO_LANGUAGE = "auto"  # session.started's language when a multilingual ASR detects it


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
    turn_detection: TurnDetectionInfo | None = None  # asr, assistant


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
    # WebRTC calls only (the call's media counters, server/webrtc/link.py): RTP packets of
    # the caller's audio that never came, and the audio that stood in for them (ms).
    packets_lost: int | UnsetType = UNSET
    concealed_ms: int | UnsetType = UNSET


class VadStart(Event, frozen=True, tag="vad.start"):
    segment: int
    start_ms: int


class VadEnd(Event, frozen=True, tag="vad.end"):
    segment: int
    start_ms: int
    end_ms: int


class WakeDetected(Event, frozen=True, tag="wake.detected"):
    """The session's `wake_word` was heard: the next turn is transcribed (docs/protocol.md)."""

    name: str
    timestamp_ms: int  # where the word ended in the session's audio (ms from its start)


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
    reason: str  # late | slow | queue (pipeline/scheduling/tts_health.py)
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


# --- conversation sessions only (the Realtime API); /v1/stream sessions send none -------


class Item(msgspec.Struct, frozen=True, gc=False):
    """One conversation item as the session holds it (ids: `speech_item_id`,
    `reply_item_id`, or the client's / the responder's)."""

    id: str
    kind: str  # message | function_call | function_call_output
    role: str | UnsetType = UNSET  # messages: user | assistant | system
    status: str = "completed"  # completed | incomplete | in_progress
    audio: bool = False  # its content is audio (with `text` its transcript)
    text: str | None = None  # None: an audio item not (yet) transcribed
    call_id: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET
    output: str | UnsetType = UNSET


class SessionUpdated(Event, frozen=True, tag="session.updated"):
    """A `session.update` was applied (the Realtime transport describes the whole session;
    /v1/stream: the turn detection now in force)."""

    turn_detection: TurnDetectionInfo | None = None


class AudioCommitted(Event, frozen=True, tag="audio.committed"):
    """A user turn's audio ends: VAD's end of speech, or the client's commit."""

    segment: int
    item_id: str
    previous_item_id: str | None


class AudioCleared(Event, frozen=True, tag="audio.cleared"):
    """The uncommitted audio was dropped (`ClearAudio`)."""


class ItemAdded(Event, frozen=True, tag="item.added"):
    item: Item
    previous_item_id: str | None


class ItemDone(Event, frozen=True, tag="item.done"):
    """The item is complete (a transcribed turn, a finished reply or call)."""

    item: Item
    previous_item_id: str | None


class ItemDeleted(Event, frozen=True, tag="item.deleted"):
    item_id: str


class ItemTruncated(Event, frozen=True, tag="item.truncated"):
    item_id: str
    content_index: int
    audio_end_ms: int


class TranscriptFailed(Event, frozen=True, tag="transcript.failed"):
    """A committed turn's transcription failed (`code`, `message` of the VoxError)."""

    segment: int
    item_id: str
    code: str
    message: str


class ResponseStarted(Event, frozen=True, tag="response.started"):
    """Reply `reply` begins: its output is `item_id` (an assistant message) unless the
    responder calls tools instead."""

    reply: int
    item_id: str
    output_modalities: tuple[str, ...]
    voice: str  # the installed voice it speaks
    in_conversation: bool
    voice_name: str = ""  # the voice as the client named it ("" : `voice`)
    metadata: tuple[tuple[str, str], ...] | None = None  # the client's (response.create)


class Usage(msgspec.Struct, frozen=True, gc=False):
    """A response's tokens as the Realtime API counts them (docs/realtime.md, "Usage"):
    audio at OpenAI's published rates (a user's 100 ms, an assistant's 50 ms: one token),
    text as the responder's server counted it, else estimated (`estimated`)."""

    input_text: int = 0
    input_audio: int = 0
    input_cached: int = 0
    output_text: int = 0
    output_audio: int = 0
    estimated: bool = False  # the text counts are voxserve's estimate, not the model's


class ResponseDone(Event, frozen=True, tag="response.done"):
    """Reply `reply` is over: everything it sent is before this. status: completed,
    cancelled (barge-in or the client's cancel; `reason` says which: turn_detected or
    client_cancelled), failed (`code`/`message` of the error), incomplete."""

    reply: int
    status: str
    reason: str | UnsetType = UNSET
    code: str | UnsetType = UNSET
    message: str | UnsetType = UNSET
    output: tuple[Item, ...] = ()  # the items it produced, as they ended
    usage: Usage | None = None


class FunctionCallDelta(Event, frozen=True, tag="function_call.delta"):
    reply: int
    item_id: str
    call_id: str
    name: str
    delta: str  # more of the arguments' JSON text


class FunctionCallDone(Event, frozen=True, tag="function_call.done"):
    reply: int
    item_id: str
    call_id: str
    name: str
    arguments: str


def speech_item_id(session_id: str, segment: int) -> str:
    """The id of the user item of a spoken turn (known from its speech start on)."""
    return f"item_{session_id}u{segment}"


def reply_item_id(session_id: str, reply: int) -> str:
    """The id of the assistant message a reply speaks or writes."""
    return f"item_{session_id}r{reply}"


StreamEvent: TypeAlias = (
    SessionStarted
    | SessionUpdated
    | SessionResumed
    | SessionEnded
    | VadStart
    | VadEnd
    | WakeDetected
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
"""What any session may send (docs/protocol.md's /v1/stream section)."""

ConversationEvent: TypeAlias = (
    AudioCommitted
    | AudioCleared
    | ItemAdded
    | ItemDone
    | ItemDeleted
    | ItemTruncated
    | TranscriptFailed
    | ResponseStarted
    | ResponseDone
    | FunctionCallDelta
    | FunctionCallDone
)
"""What only a conversation session sends (docs/realtime.md maps each onto the Realtime
API's events)."""

ServerEvent: TypeAlias = StreamEvent | ConversationEvent


def event_type(event: Event) -> str:
    """The wire `type` of an event (its tag), e.g. for a log line."""
    return str(event.__struct_config__.tag)

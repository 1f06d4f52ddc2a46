"""Server events -> voxserve.v1 responses: gRPC's one encoder of the protocol's events, pure.

The match over `ServerEvent` is exhaustive (mypy checks it with `assert_never`): a new event
fails type checking until it is given a message here or a stated reason why voxserve.v1 has
none. The proto is fixed (its clients are generated from it), so those reasons stand.
"""

from __future__ import annotations

from typing import TypeVar, assert_never

from voxserve.events import (
    UNSET,
    AudioCleared,
    AudioCommitted,
    BargeIn,
    Credit,
    ErrorEvent,
    FunctionCallDelta,
    FunctionCallDone,
    ItemAdded,
    ItemDeleted,
    ItemDone,
    ItemTruncated,
    Mark,
    Mode,
    ResponseDelta,
    ResponseDone,
    ResponseStarted,
    ResponseText,
    ServerEvent,
    SessionEnded,
    SessionResumed,
    SessionStarted,
    SessionUpdated,
    TranscriptFailed,
    TranscriptFinal,
    TranscriptPartial,
    TtsEnd,
    TtsFallback,
    TtsStart,
    VadEnd,
    VadStart,
    WakeDetected,
)
from voxserve.v1 import voxserve_pb2 as pb

MODE_ENUM: dict[Mode, pb.Mode] = {
    "asr": pb.MODE_ASR,
    "tts": pb.MODE_TTS,
    "assistant": pb.MODE_ASSISTANT,
}

R = TypeVar("R", pb.ConverseResponse, pb.RecognizeResponse)


def encode_event(event: ServerEvent, response_type: type[R]) -> R | None:
    """The response carrying `event`, or None where this wire has no message for it: the
    events voxserve.v1 lacks (said case by case below), and reply events in a Recognize
    stream, whose response has no field for them (an asr session makes none)."""
    response = response_type()
    return response if _fill(response, event) else None


def _fill(response: pb.ConverseResponse | pb.RecognizeResponse, event: ServerEvent) -> bool:
    """Set the response's field for `event`; False when it has none. The frequent events
    (partials, credit, marks) come first: a case is an isinstance check."""
    match event:
        case TranscriptPartial():
            _transcript(response.transcript, event, final=False)
        case Credit():
            # gRPC paces the client with HTTP/2 flow control; voxserve.v1 has no message for
            # the WebSocket's input window (nor an acknowledgement of seq_ids but in marks).
            return False
        case Mark():
            if not isinstance(response, pb.ConverseResponse):
                return False  # a Recognize request has no marks to echo
            response.mark.id = str(event.id)
        case VadStart():
            response.vad_start.segment = event.segment
            response.vad_start.start_ms = _ms(event.start_ms)
        case VadEnd():
            response.vad_end.segment = event.segment
            response.vad_end.start_ms = _ms(event.start_ms)
            response.vad_end.end_ms = _ms(event.end_ms)
        case TranscriptFinal():
            _transcript(response.transcript, event, final=True)
            response.transcript.language = event.language
        case ResponseDelta() | ResponseText():
            if not isinstance(response, pb.ConverseResponse):
                return False  # Recognize: no replies
            field = (
                response.response_delta
                if isinstance(event, ResponseDelta)
                else response.response_text
            )
            field.reply = event.reply
            field.text = event.text
        case TtsStart():
            if not isinstance(response, pb.ConverseResponse):
                return False
            response.tts_start.reply = event.reply
            response.tts_start.voice = event.voice
            response.tts_start.sample_rate = event.sample_rate
            response.tts_start.encoding = event.encoding
        case TtsEnd():
            if not isinstance(response, pb.ConverseResponse):
                return False
            end = response.tts_end
            end.reply = event.reply
            end.chunks = event.chunks
            end.audio_ms = _ms(event.audio_ms)
            end.interrupted = event.interrupted
            end.played_ms = _ms(event.played_ms)  # underruns: not in voxserve.v1's TtsEnd
        case TtsFallback():
            # voxserve.v1 has no message for it: the fallback phrase itself still comes, as
            # the reply's audio between its tts_start and tts_end.
            return False
        case BargeIn():
            if not isinstance(response, pb.ConverseResponse):
                return False
            response.barge_in.segment = event.segment
        case ErrorEvent():
            _error(response.error, event)
        case SessionStarted():
            _started(response.started, event)
        case SessionEnded():
            _ended(response.ended, event)
        case SessionResumed():
            # Only the WebSocket parks and resumes sessions (a gRPC call is its session).
            return False
        case WakeDetected():
            # Only the WebSocket's session.start takes a wake_word (voxserve.v1 has none).
            return False
        case (
            SessionUpdated()
            | AudioCommitted()
            | AudioCleared()
            | ItemAdded()
            | ItemDone()
            | ItemDeleted()
            | ItemTruncated()
            | TranscriptFailed()
            | ResponseStarted()
            | ResponseDone()
            | FunctionCallDelta()
            | FunctionCallDone()
        ):
            # Conversation sessions' events: only the Realtime API opens such sessions
            # (server/realtime/stream.py); voxserve.v1 has no conversation.
            return False
        case _:
            assert_never(event)
    return True


def _transcript(m: pb.Transcript, e: TranscriptPartial | TranscriptFinal, *, final: bool) -> None:
    m.segment = e.segment
    m.text = e.text
    m.is_final = final
    m.start_ms = _ms(e.start_ms)
    m.end_ms = _ms(e.end_ms)


def _started(m: pb.SessionStarted, e: SessionStarted) -> None:
    m.session_id = e.session_id
    m.trace_id = e.trace_id
    m.mode = MODE_ENUM.get(e.mode, pb.MODE_UNSPECIFIED)
    m.sample_rate = e.sample_rate
    m.encoding = e.encoding
    m.language = e.language
    m.voice = e.voice
    m.output_sample_rate = e.output_sample_rate
    m.frame_ms = e.frame_ms  # credit_window, resumable: WebSocket flow control and resume


def _error(m: pb.Error, e: ErrorEvent) -> None:
    """retry_after_ms and trace_id travel in the call's trailing metadata instead."""
    m.code = e.code
    m.message = e.message
    m.fatal = e.fatal
    m.stage = "" if e.stage is UNSET else e.stage
    if e.segment is not UNSET:
        m.segment = e.segment
    if e.reply is not UNSET:
        m.reply = e.reply


# session.ended's counters, the same names in both (tests/transports/test_grpc_codec.py).
_ENDED_COUNTERS = (
    "received", "duplicates", "accepted", "processed", "dropped", "rejected", "gaps",
    "reordered", "segments", "replies", "interrupted", "duration_ms",
)  # fmt: skip


def _ended(m: pb.SessionEnded, e: SessionEnded) -> None:
    m.session_id = e.session_id
    m.trace_id = e.trace_id
    m.reason = e.reason
    for name in _ENDED_COUNTERS:  # the proto's fields are unsigned
        setattr(m, name, max(0, getattr(e, name)))


def _ms(value: object) -> int:
    """Milliseconds as the proto's unsigned field (0 for a negative or absent value)."""
    if isinstance(value, int | float) and value > 0:
        return int(value)
    return 0


def encode_audio(pcm: bytes, reply: int) -> pb.ConverseResponse:
    """Reply audio (the WebSocket's binary message) with the reply it belongs to."""
    response = pb.ConverseResponse()
    response.audio.reply = reply
    response.audio.pcm = pcm
    return response

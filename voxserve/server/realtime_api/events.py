"""voxserve's server events and reply audio -> the Realtime API's server events: the encoder of
/v1/realtime, stateful per connection, pure (no I/O). docs/realtime.md has the table.

The match over `ServerEvent` is exhaustive (mypy checks it with `assert_never`): a new event
fails type checking until it has Realtime events here or a stated reason why it has none.
What the encoder keeps is the wire's, not the conversation's: each reply's response id and
its outputs' indexes (so every event of a response ties to its item_id, output_index and
content_index), the reply whose audio is playing, and the transcript already sent as
deltas per turn (input transcription deltas are append-only: a partial's words are sent
once the next partial keeps them).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Sequence
from typing import Any, assert_never

import msgspec

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
    speech_item_id,
)
from voxserve.server.realtime_api.responses import (
    RateLimit,
    ResponseEvents,
    error_type,
)
from voxserve.server.realtime_api.session import UPDATE_STAGE, RealtimeWire, describe
from voxserve.server.session.partials import stable_delta

Obj = dict[str, Any]
BETA: dict[str, str] = {
    "conversation.item.added": "conversation.item.created",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}
"""GA names whose beta name differs (conversation.item.done has none in beta: not sent)."""
SERVER_EVENTS = (
    "session.created",
    "session.updated",
    "input_audio_buffer.speech_started",
    "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed",
    "input_audio_buffer.cleared",
    "conversation.item.added",
    "conversation.item.done",
    "conversation.item.deleted",
    "conversation.item.truncated",
    "conversation.item.input_audio_transcription.delta",
    "conversation.item.input_audio_transcription.completed",
    "conversation.item.input_audio_transcription.failed",
    "response.created",
    "rate_limits.updated",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_audio_transcript.delta",
    "response.output_text.delta",
    "response.output_audio.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.done",
    "error",
    "voxserve.session.ended",
    "voxserve.tts.fallback",
)
"""Every server event type the encoder sends, by GA name (docs/realtime.md's table)."""
TRACK_EVENTS = (
    "output_audio_buffer.started",
    "output_audio_buffer.stopped",
    "output_audio_buffer.cleared",
)
"""A WebRTC call's events about its outgoing track, made by its link (server/webrtc/link.py,
`RealtimeEncoder.extra`), not from voxserve events; the same names in beta."""


def server_event_names(*, beta: bool) -> set[str]:
    """The types a GA or a beta client may receive (beta: transcription_session.updated
    for a transcription session's session.updated; no conversation.item.done)."""
    if not beta:
        return set(SERVER_EVENTS)
    names = {BETA.get(name, name) for name in SERVER_EVENTS} - {"conversation.item.done"}
    return names | {"transcription_session.updated"}


MAX_TURNS = 64  # turns whose transcript deltas are tracked (a final forgets its turn)
_encode_json = msgspec.json.Encoder().encode


class RealtimeEncoder:
    """One connection's encoder; `wire` is shared with its RealtimeDecoder. `rate_limits`
    gives the figures of rate_limits.updated (sent after each response.created)."""

    def __init__(
        self, wire: RealtimeWire, rate_limits: Callable[[], Sequence[RateLimit]] = tuple
    ) -> None:
        self.wire = wire
        self._ids = itertools.count(1)
        # A connection refused before its session opens has no session id: its events are
        # numbered under one of their own, so every event id is unique (not "event__1").
        self._unopened = secrets.token_hex(8)
        self.responses = ResponseEvents(wire, self._ev, rate_limits)
        self._turns: dict[int, tuple[str, str]] = {}  # segment -> (last partial, sent)

    def encode(self, event: ServerEvent) -> list[str]:
        """The JSON texts to send for `event`, in order."""
        return [_encode_json(e).decode() for e in self.events(event)]

    def encode_audio(self, pcm: bytes) -> list[str]:
        return [_encode_json(e).decode() for e in self.responses.audio(pcm)]

    def extra(self, kind: str, **fields: Any) -> str:
        """An event the encoder does not make from voxserve events (TRACK_EVENTS), numbered
        among the others."""
        return _encode_json(self._ev(kind, **fields)).decode()

    def _ev(self, kind: str, **fields: Any) -> Obj:
        if self.wire.beta:
            kind = BETA.get(kind, kind)
        return {
            "event_id": f"event_{self.wire.session_id or self._unopened}_{next(self._ids)}",
            "type": kind,
        } | fields

    def events(self, event: ServerEvent) -> list[Obj]:
        """The Realtime server events for `event` (dicts, before JSON)."""
        match event:
            case TranscriptPartial():
                return self._partial(event)
            case TranscriptFinal():
                return self._final(event)
            case ResponseDelta():
                return self.responses.delta(event)
            case VadStart():
                item_id = speech_item_id(self.wire.session_id, event.segment)
                return [
                    self._ev(
                        "input_audio_buffer.speech_started",
                        audio_start_ms=event.start_ms,
                        item_id=item_id,
                    )
                ]
            case VadEnd():
                item_id = speech_item_id(self.wire.session_id, event.segment)
                return [
                    self._ev(
                        "input_audio_buffer.speech_stopped",
                        audio_end_ms=event.end_ms,
                        item_id=item_id,
                    )
                ]
            case AudioCommitted():
                return [
                    self._ev(
                        "input_audio_buffer.committed",
                        item_id=event.item_id,
                        previous_item_id=event.previous_item_id,
                    )
                ]
            case AudioCleared():
                return [self._ev("input_audio_buffer.cleared")]
            case ItemAdded():
                return self.responses.item_added(event.item, event.previous_item_id)
            case ItemDone():
                return self.responses.item_done(event.item, event.previous_item_id)
            case ItemDeleted():
                return [self._ev("conversation.item.deleted", item_id=event.item_id)]
            case ItemTruncated():
                return [
                    self._ev(
                        "conversation.item.truncated",
                        item_id=event.item_id,
                        content_index=event.content_index,
                        audio_end_ms=event.audio_end_ms,
                    )
                ]
            case TranscriptFailed():
                self._turns.pop(event.segment, None)
                error = {
                    "type": "transcription_error",
                    "code": event.code,
                    "message": event.message,
                    "param": None,
                }
                return [
                    self._ev(
                        "conversation.item.input_audio_transcription.failed",
                        item_id=event.item_id,
                        content_index=0,
                        error=error,
                    )
                ]
            case ResponseStarted():
                return self.responses.started(event)
            case ResponseText():
                return self.responses.text_done(event.reply, event.text)
            case TtsStart():
                # the content part was added with the item (response.content_part.added)
                return self.responses.tts_start(event.reply)
            case TtsEnd():
                return self.responses.tts_end(event.reply)
            case FunctionCallDelta():
                return self.responses.call_delta(event)
            case FunctionCallDone():
                return self.responses.call_done(event)
            case ResponseDone():
                return self.responses.done(event)
            case ErrorEvent():
                return [self._error(event)]
            case SessionStarted():
                self.wire.session_id = event.session_id
                return [self._ev("session.created", session=describe(self.wire))]
            case SessionUpdated():
                self.wire.applied()
                kind = "session.updated"
                if self.wire.beta and self.wire.settings.kind == "transcription":
                    kind = "transcription_session.updated"
                return [self._ev(kind, session=describe(self.wire))]
            case SessionEnded():
                counters = {
                    name: value
                    for name, value in msgspec.structs.asdict(event).items()
                    if value is not UNSET  # a WebRTC call's media counters, else unset
                }
                return [self._ev("voxserve.session.ended", **counters)]
            case SessionResumed():
                # Realtime sessions are never resumable (the handshake does not ask): none.
                return []
            case WakeDetected():
                # Realtime sessions have no wake word (only /v1/stream's session.start).
                return []
            case Mark() | Credit():
                # Realtime clients send no marks and have no input credit window: the
                # WebSocket's own flow control paces them. Never made for them.
                return []
            case TtsFallback():
                return [
                    self._ev(
                        "voxserve.tts.fallback",
                        response_id=self.responses.response_id(event.reply),
                        reason=event.reason,
                        text=event.text,
                    )
                ]
            case BargeIn():
                # speech_started has told the client already; the reply's cut item and its
                # response.done (cancelled, turn_detected) follow.
                return []
            case _:
                assert_never(event)

    # --- input transcription ------------------------------------------------------------------

    def _transcribes(self) -> bool:
        s = self.wire.settings
        return s.transcription is not None or s.kind == "transcription"

    def _partial(self, event: TranscriptPartial) -> list[Obj]:
        previous, sent = self._turns.pop(event.segment, ("", ""))
        if len(self._turns) >= MAX_TURNS:
            self._turns.pop(next(iter(self._turns)))
        delta = stable_delta(previous, event.text, sent) if self._transcribes() else ""
        self._turns[event.segment] = (event.text, sent + delta)
        return [self._transcript_delta(event.segment, delta)] if delta else []

    def _transcript_delta(self, segment: int, delta: str) -> Obj:
        return self._ev(
            "conversation.item.input_audio_transcription.delta",
            item_id=speech_item_id(self.wire.session_id, segment),
            content_index=0,
            delta=delta,
        )

    def _final(self, event: TranscriptFinal) -> list[Obj]:
        _, sent = self._turns.pop(event.segment, ("", ""))
        if not self._transcribes():
            return []
        out = []
        if event.text.startswith(sent) and len(event.text) > len(sent):
            out.append(self._transcript_delta(event.segment, event.text[len(sent) :]))
        seconds = max(0, event.end_ms - event.start_ms) / 1000
        out.append(
            self._ev(
                "conversation.item.input_audio_transcription.completed",
                item_id=speech_item_id(self.wire.session_id, event.segment),
                content_index=0,
                transcript=event.text,
                usage={"type": "duration", "seconds": seconds},
            )
        )
        return out

    # --- errors ------------------------------------------------------------------------------

    def _error(self, event: ErrorEvent) -> Obj:
        wire = self.wire
        event_id = None
        for i, (code, message, client_id) in enumerate(wire.refusals):
            if code == event.code and message == event.message:
                event_id = client_id
                for _ in range(i + 1):
                    wire.refusals.popleft()
                break
        else:
            if event.stage == UPDATE_STAGE:
                event_id = wire.refused()  # the session refused the oldest session.update
        error = {
            "type": error_type(event.code),
            "code": event.code,
            "message": event.message,
            "param": None,
            "event_id": event_id,
        }
        return self._ev("error", error=error)

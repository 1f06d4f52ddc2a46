"""The Realtime API's client events -> voxserve's client messages and audio frames: the
decoder of /v1/realtime (server/realtime/stream.py), pure (no I/O), fuzzed like the other
wire parsers (tests/fuzz/test_realtime_codec_fuzz.py).

`input_audio_buffer.append` carries base64 audio with no sequence numbers: the decoder
converts it to PCM16 (G.711 decoded at 8 kHz; `audio/pcm` is 24 kHz PCM16 already), cuts
it into 20 ms frames at the session's input rate and numbers them itself, as
grpc_codec.split_frames cuts a gRPC message. A tail shorter than a frame is held until the
next append (a commit leaves it to start the next turn: under 20 ms, never dropped;
`input_audio_buffer.clear` drops it with the rest). A `session.update` is merged into the
settings the client last asked for and becomes a SessionUpdate with the whole new config.

Every bad event raises VoxError (BadAudio around the audio ones, so they count in the
session's `rejected`), never fatal; `last_event_id` is the client event id of the event
last decoded, and each refusal is remembered with it so that the encoder's error event
carries it (realtime_session.RealtimeWire.refusals).
"""

from __future__ import annotations

import binascii
from collections.abc import Callable
from typing import Any, Literal

import msgspec

from voxserve.audio import g711
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.events import (
    CancelMessage,
    ClearAudio,
    ClientMessage,
    CommitAudio,
    DeleteItem,
    SessionUpdate,
    TruncateItem,
)
from voxserve.server.realtime_api.items import create_item, create_response
from voxserve.server.realtime_api.session import FORMAT_RATES, RealtimeSettings, RealtimeWire
from voxserve.server.realtime_api.update import speaks_beta, update_beta, update_ga
from voxserve.server.session import fields as f
from voxserve.server.session.input import BadAudio, Decoded, Frames
from voxserve.server.session.json_input import DEFAULT_MAX_DEPTH, decode_json
from voxserve.types import FRAME_MS

Obj = dict[str, Any]
SEQ_MOD = 1 << 32
MAX_TRUNCATE_MS = 24 * 3600 * 1000

OUTPUT_CLEAR = "output_audio_buffer.clear"
REFUSED: dict[str, str] = {
    "conversation.item.retrieve": (
        "conversation.item.retrieve is not supported: voxserve keeps no audio of items"
        " (their text comes in conversation.item.done)"
    ),
    OUTPUT_CLEAR: (
        "output_audio_buffer.clear is for WebRTC and SIP only; over a WebSocket the client"
        " stops playback and sends conversation.item.truncate"
    ),
}
"""Client events of the Realtime API voxserve refuses on purpose (`invalid_message`)."""


class _Append(msgspec.Struct, forbid_unknown_fields=True):
    """An `input_audio_buffer.append` as clients send it, 50 a second per stream: JSON and
    base64 decoded in one C pass (binascii's base64 alone took longer). msgspec's base64 is
    stricter than binascii's strict mode (it refuses padding past the last quantum), never
    laxer. Anything that does not fit (another event, another field, a bad value) takes
    the general path, which finds and reports what is wrong."""

    type: Literal["input_audio_buffer.append"]
    audio: bytes
    event_id: str | None = None


_decode_append = msgspec.json.Decoder(_Append).decode


class RealtimeDecoder:
    """One connection's decoder; `wire` is shared with its RealtimeEncoder. `output_clear`:
    what `output_audio_buffer.clear` becomes on a WebRTC call (media "track", where the
    call's link clears its outgoing track: server/webrtc/link.py); elsewhere the event is
    refused (REFUSED), as OpenAI refuses it over a WebSocket."""

    def __init__(
        self,
        wire: RealtimeWire,
        max_message_bytes: int,
        max_depth: int = DEFAULT_MAX_DEPTH,
        *,
        output_clear: Callable[[], Decoded] | None = None,
    ) -> None:
        self.wire = wire
        self.output_clear = output_clear
        self.max_message_bytes = max_message_bytes
        self.max_depth = max_depth
        self.last_event_id: str | None = None
        self._held = bytearray()  # PCM16 of the current input format, under one frame
        self._seq = 0
        self._handlers: dict[str, Callable[[Obj], Decoded]] = {
            "input_audio_buffer.append": self._append,
            "input_audio_buffer.commit": lambda _: CommitAudio(),
            "input_audio_buffer.clear": self._clear,
            "session.update": self._session_update,
            "transcription_session.update": self._transcription_update,
            "conversation.item.create": create_item,
            "conversation.item.delete": self._delete,
            "conversation.item.truncate": self._truncate,
            "response.create": lambda data: create_response(data, self.wire),
            "response.cancel": self._cancel,
        }

    @property
    def event_types(self) -> tuple[str, ...]:
        """The client event types it decodes (docs/realtime.md lists the same)."""
        return tuple(self._handlers)

    def decode(self, raw: str | bytes) -> Decoded:
        """One client text message -> Frames or a ClientMessage; VoxError (BadAudio for
        audio) when it cannot be taken."""
        self.last_event_id = None
        try:
            return self._decode(raw)
        except BadAudio as bad:
            self._remember(bad.error)
            raise
        except VoxError as exc:
            self._remember(exc)
            raise

    def _remember(self, error: VoxError) -> None:
        self.wire.refusals.append((error.code.value, error.message, self.last_event_id))

    def _decode(self, raw: str | bytes) -> Decoded:
        # The fast path takes only what decode_json would take as is: plain ASCII within the
        # size, no escapes (so no lone surrogate), and no field it does not know (no nesting).
        if (
            isinstance(raw, str)
            and len(raw) <= self.max_message_bytes
            and raw.isascii()
            and "\\" not in raw
        ):
            try:
                append = _decode_append(raw)
            except msgspec.DecodeError:  # ValidationError too
                pass
            else:
                event_id = append.event_id
                if event_id is None or len(event_id) <= f.MAX_ID:
                    self.last_event_id = event_id
                    return self._audio(append.audio)
        return self.decode_event(raw)

    def holdable(self, payload: bytes) -> bool:
        """Whether an append (its raw text) may be held back by the fast path
        (server/websocket/fastpath.py) before it is decoded: only one this decoder will take as it
        is, so that a refused append is handed over at once and its error comes at once,
        not at the next event. The check costs ~2.6 us an append (the decode itself ~3.5 us:
        a 20 ms append of 24 kHz PCM, timeit on the shared two-core box)."""
        if len(payload) > self.max_message_bytes or b"\\" in payload or not payload.isascii():
            return False
        try:
            append = _decode_append(payload)
        except msgspec.DecodeError:  # ValidationError too
            return False
        event_id, audio = append.event_id, append.audio
        if not audio or self.wire.media == "track":
            return False
        if event_id is not None and len(event_id) > f.MAX_ID:
            return False
        return self.wire.latest.input_format != "audio/pcm" or len(audio) % 2 == 0

    def decode_event(self, raw: str | bytes) -> Decoded:
        """`_decode` the general way: any client event (scripts/bench_realtime_codec.py
        times it against the append fast path)."""
        data = decode_json(
            raw, max_bytes=self.max_message_bytes, max_depth=self.max_depth, what="client event"
        )
        if not isinstance(data, dict):
            raise VoxError(ErrorCode.INVALID_JSON, "a client event must be a JSON object")
        event_id = data.get("event_id")
        if isinstance(event_id, str) and len(event_id) <= f.MAX_ID:
            self.last_event_id = event_id
        elif event_id is not None:
            raise f.invalid(f"event_id must be a string of at most {f.MAX_ID} characters")
        kind = data.get("type")
        if not isinstance(kind, str):
            raise f.invalid("a client event needs a string field 'type'")
        handler = self._handlers.get(kind)
        if kind == OUTPUT_CLEAR and self.wire.media == "track" and self.output_clear:
            handler = self._output_clear
        if handler is None:
            raise f.invalid(REFUSED.get(kind) or f"unknown client event type {quoted(kind)}")
        return handler(data)

    # --- audio ----------------------------------------------------------------------------

    def _append(self, data: Obj) -> Frames:
        try:
            audio = f.string(data, "audio", "", required=True)
        except VoxError as exc:
            raise BadAudio(exc) from None
        assert audio is not None
        try:
            payload = binascii.a2b_base64(audio, strict_mode=True)
        except (binascii.Error, ValueError):
            raise BadAudio(VoxError(ErrorCode.INVALID_AUDIO, "audio is not valid base64")) from None
        return self._audio(payload)

    def _audio(self, payload: bytes) -> Frames:
        """Decoded audio of an append -> frames of the input format."""
        if self.wire.media == "track":  # the session takes the track's rate, not the format's
            message = "on a WebRTC call the audio comes on the call's track, not in events"
            raise BadAudio(VoxError(ErrorCode.INVALID_MESSAGE, message))
        if not payload:
            raise BadAudio(VoxError(ErrorCode.EMPTY_AUDIO, "audio carries no samples"))
        fmt = self.wire.latest.input_format
        if fmt == "audio/pcmu":
            pcm = g711.decode(payload, "ulaw")
        elif fmt == "audio/pcma":
            pcm = g711.decode(payload, "alaw")
        elif len(payload) % 2:
            error = VoxError(ErrorCode.ODD_LENGTH_PCM, f"PCM16 audio has odd length {len(payload)}")
            raise BadAudio(error)
        else:
            pcm = payload
        return self._frames(pcm, FORMAT_RATES[fmt])

    def _frames(self, pcm: bytes, rate: int) -> Frames:
        step = rate * FRAME_MS // 1000 * 2
        if self._held:
            self._held += pcm
            buffer = memoryview(bytes(self._held))
        else:
            buffer = memoryview(pcm)
        size = len(buffer)
        whole = size - size % step
        if whole < size:
            self._held = bytearray(buffer[whole:])
        elif self._held:
            self._held = bytearray()
        seq = self._seq
        if size == step:  # the usual append: one frame, no tail
            self._seq = (seq + 1) % SEQ_MOD
            return [(seq, buffer)]
        frames = [
            ((seq + i) % SEQ_MOD, buffer[start : start + step])
            for i, start in enumerate(range(0, whole, step))
        ]
        self._seq = (seq + len(frames)) % SEQ_MOD
        return frames

    def _output_clear(self, data: Obj) -> Decoded:
        """A call's `output_audio_buffer.clear` (type and event_id only: as the SDK sends it)."""
        extra = sorted(set(data) - {"type", "event_id"})
        if extra:
            raise f.bad_value(extra[0], "is not a field of output_audio_buffer.clear")
        assert self.output_clear is not None
        return self.output_clear()

    def _clear(self, _: Obj) -> ClientMessage:
        self._held.clear()
        return ClearAudio()

    # --- the session ---------------------------------------------------------------------

    def _session_update(self, data: Obj) -> ClientMessage:
        session = f.obj(data, "session", "", required=True)
        assert session is not None
        wire = self.wire
        if speaks_beta(session):
            wire.beta = True
            settings = update_beta(wire.latest, session)
        else:
            settings = update_ga(wire.latest, session)
        return self._propose(settings)

    def _transcription_update(self, data: Obj) -> ClientMessage:
        session = f.obj(data, "session", "", required=True)
        assert session is not None
        self.wire.beta = True
        return self._propose(update_beta(self.wire.latest, session, transcription=True))

    def _propose(self, settings: RealtimeSettings) -> ClientMessage:
        if FORMAT_RATES[settings.input_format] != FORMAT_RATES[self.wire.latest.input_format]:
            self._held.clear()  # under 20 ms at the old rate: no sense at the new one
        return SessionUpdate(self.wire.propose(settings, self.last_event_id))

    # --- items and responses ---------------------------------------------------------------

    def _delete(self, data: Obj) -> ClientMessage:
        item_id = f.an_id(data, "item_id", "", required=True)
        assert item_id is not None
        return DeleteItem(item_id)

    def _truncate(self, data: Obj) -> ClientMessage:
        item_id = f.an_id(data, "item_id", "", required=True)
        content_index = f.integer(data, "content_index", "", 0, 0, required=True)
        audio_end_ms = f.integer(data, "audio_end_ms", "", 0, MAX_TRUNCATE_MS, required=True)
        assert item_id is not None and content_index is not None and audio_end_ms is not None
        return TruncateItem(item_id, content_index, audio_end_ms)

    def _cancel(self, data: Obj) -> ClientMessage:
        f.an_id(data, "response_id", "")  # checked; the session cancels the one in progress
        return CancelMessage()

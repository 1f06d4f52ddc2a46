"""The events of a response (response.created to response.done) for the Realtime encoder
(realtime_api/events.py): which reply is which response, each output item's output_index, the
content part of its message, and the done events an output still owes when it ends (a
barge-in cuts a reply short: its item still gets its transcript, part and item done
events, then response.done). Pure, per connection."""

from __future__ import annotations

from base64 import b64encode
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from voxserve.audio import g711
from voxserve.errors import ErrorCode
from voxserve.events import (
    UNSET,
    FunctionCallDelta,
    FunctionCallDone,
    Item,
    ResponseDelta,
    ResponseDone,
    ResponseStarted,
    Usage,
)
from voxserve.pipeline.conversation.usage import USER_AUDIO_MS_PER_TOKEN
from voxserve.server.realtime_api.items import item_dict
from voxserve.server.realtime_api.session import BETA_NAMES, RealtimeWire, audio_format
from voxserve.server.session.quotas import Quotas

Obj = dict[str, Any]
CLIENT_CODES = frozenset(
    {
        ErrorCode.NOT_STARTED,
        ErrorCode.ALREADY_STARTED,
        ErrorCode.INVALID_JSON,
        ErrorCode.INVALID_MESSAGE,
        ErrorCode.UNKNOWN_MODE,
        ErrorCode.UNKNOWN_VOICE,
        ErrorCode.UNKNOWN_LANGUAGE,
        ErrorCode.UNSUPPORTED_SAMPLE_RATE,
        ErrorCode.UNSUPPORTED_ENCODING,
        ErrorCode.ODD_LENGTH_PCM,
        ErrorCode.FRAME_TOO_SHORT,
        ErrorCode.FRAME_TOO_LARGE,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.TEXT_TOO_LONG,
        ErrorCode.EMPTY_TEXT,
        ErrorCode.EMPTY_AUDIO,
        ErrorCode.INVALID_AUDIO,
        ErrorCode.INVALID_PARAMETER,
        ErrorCode.WRONG_MODE,
        ErrorCode.RESPONSE_ACTIVE,  # the reply helper's codes (merged in i21-door)
        ErrorCode.RESPONSE_NOT_ACTIVE,
        ErrorCode.SESSION_TOO_LARGE,
        ErrorCode.UNAUTHORIZED,  # refusals of the connection: the client's to fix, as OpenAI
        ErrorCode.ORIGIN_NOT_ALLOWED,
        ErrorCode.HOST_NOT_ALLOWED,
    }
)
"""Codes of errors the client can fix: `invalid_request_error`; the others `server_error`."""
STATUS_REASONS = ("turn_detected", "client_cancelled", "max_output_tokens", "content_filter")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """One entry of rate_limits.updated (the SDK names only `requests` and `tokens`)."""

    name: str
    limit: int
    remaining: int
    reset_seconds: float


def request_limits(quotas: Quotas, principal: str) -> tuple[RateLimit, ...]:
    """rate_limits.updated's figures for a connection of `principal`: its key's request
    rate (quotas.requests_per_s, a bucket of `burst`) as `requests`, and its audio quota
    (quotas.audio_s_per_min) as `tokens`, counted as a user's audio tokens (10 a second:
    pipeline/conversation/usage.py); none for a quota that does not apply."""
    limits = []
    requests = quotas.requests_left(principal)
    if requests is not None:
        size, left, reset_s = requests
        limits.append(RateLimit("requests", int(size), int(left), round(reset_s, 3)))
    audio = quotas.audio_left(principal)
    if audio is not None:
        size_s, left_s, reset_s = audio
        per_s = 1000 // USER_AUDIO_MS_PER_TOKEN
        limits.append(
            RateLimit("tokens", int(size_s * per_s), int(left_s * per_s), round(reset_s, 3))
        )
    return tuple(limits)


@dataclass(slots=True)
class _Response:
    id: str
    reply: int
    item_id: str  # its assistant message (if it speaks or writes)
    modalities: tuple[str, ...]
    voice: str  # as the client named it
    in_conversation: bool
    metadata: Obj | None
    outputs: dict[str, int] = field(default_factory=dict)  # item id -> output_index
    done: set[str] = field(default_factory=set)
    text_done: bool = False
    audio_done: bool = False
    sent: str = ""  # the reply text sent as deltas: its message's text if it never ends
    calls: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # (call, name, args)

    def ids(self, item_id: str) -> Obj:
        return {"response_id": self.id, "item_id": item_id, "output_index": self.outputs[item_id]}

    @property
    def audio(self) -> bool:
        return "audio" in self.modalities


class ResponseEvents:
    """The responses of one connection; `make(type, **fields)` builds an event."""

    def __init__(
        self,
        wire: RealtimeWire,
        make: Callable[..., Obj],
        rate_limits: Callable[[], Sequence[RateLimit]],
    ) -> None:
        self.wire = wire
        self._ev = make
        self.rate_limits = rate_limits
        self._responses: dict[int, _Response] = {}
        self._items: dict[str, _Response] = {}  # output item id -> its response
        self._playing: _Response | None = None  # the reply whose audio comes now
        self._odd = b""  # a PCM byte left over when a chunk had odd length (G.711 only)

    def tts_start(self, reply: int) -> list[Obj]:
        self._playing = r = self._responses.get(reply)
        return self._announce(r)

    def _announce(self, r: _Response | None) -> list[Obj]:
        """The response's message announced (output_item.added, content_part.added) if its
        ItemAdded has not come yet: a delta or its audio is never dropped for want of it."""
        if r is None or r.item_id in r.outputs:
            return []
        item = Item(r.item_id, "message", role="assistant", status="in_progress", audio=r.audio)
        return self.item_added(item, None)

    def tts_end(self, reply: int) -> list[Obj]:
        return self._audio_done(self._responses.get(reply))

    def response_id(self, reply: int) -> str | None:
        r = self._responses.get(reply)
        return None if r is None else r.id

    def _response_object(self, r: _Response, status: str, **more: Any) -> Obj:
        s = self.wire.settings
        conversation = f"conv_{self.wire.session_id}" if r.in_conversation else None
        base: Obj = {
            "id": r.id,
            "object": "realtime.response",
            "status": status,
            "status_details": None,
            "output": [],
            "conversation_id": conversation,
            "max_output_tokens": s.max_output_tokens or "inf",
            "metadata": r.metadata,
            "usage": None,
        }
        if self.wire.beta:
            base |= {
                "modalities": ["text", "audio"] if r.audio else ["text"],
                "voice": r.voice,
                "output_audio_format": BETA_NAMES[s.output_format],
            }
        else:
            base |= {
                "output_modalities": list(r.modalities),
                "audio": {"output": {"format": audio_format(s.output_format), "voice": r.voice}},
            }
        return base | more

    def started(self, event: ResponseStarted) -> list[Obj]:
        r = _Response(
            f"resp_{self.wire.session_id}_{event.reply}",
            event.reply,
            event.item_id,
            event.output_modalities,
            event.voice_name or event.voice,
            event.in_conversation,
            None if event.metadata is None else dict(event.metadata),
        )
        self._responses[event.reply] = r
        limits = [
            {
                "name": x.name,
                "limit": x.limit,
                "remaining": x.remaining,
                "reset_seconds": x.reset_seconds,
            }
            for x in self.rate_limits()
        ]
        return [
            self._ev("response.created", response=self._response_object(r, "in_progress")),
            self._ev("rate_limits.updated", rate_limits=limits),
        ]

    def _owner(self, item: Item) -> _Response | None:
        """The response an item is an output of: its message, or a call made while it runs
        (added in progress: a call the client adds meanwhile is added complete, and is the
        conversation's, not the response's)."""
        known = self._items.get(item.id)
        if known is not None or item.kind == "function_call_output":
            return known
        made = item.kind == "function_call" and item.status == "in_progress"
        for r in reversed(self._responses.values()):
            if item.id == r.item_id or made:
                return r
        return None

    def item_added(self, item: Item, previous: str | None) -> list[Obj]:
        beta = self.wire.beta
        r = self._owner(item)
        if r is not None and item.id in r.outputs:
            return []  # announced already (at its first delta: _announced)
        out = []
        if r is not None:
            r.outputs[item.id] = len(r.outputs)
            self._items[item.id] = r
            out.append(
                self._ev(
                    "response.output_item.added",
                    response_id=r.id,
                    output_index=r.outputs[item.id],
                    item=item_dict(item, beta=beta),
                )
            )
        if r is None or r.in_conversation:
            out.append(
                self._ev(
                    "conversation.item.added",
                    previous_item_id=previous,
                    item=item_dict(item, beta=beta),
                )
            )
        if r is not None and item.kind == "message":
            part = {"type": "audio", "transcript": ""} if r.audio else {"type": "text", "text": ""}
            out.append(
                self._ev(
                    "response.content_part.added", **r.ids(item.id), content_index=0, part=part
                )
            )
        return out

    def delta(self, event: ResponseDelta) -> list[Obj]:
        r = self._responses.get(event.reply)
        if r is None:
            return []  # a reply with no response: none in a conversation session
        out = self._announce(r)
        r.sent += event.text
        kind = "response.output_audio_transcript.delta" if r.audio else "response.output_text.delta"
        return [*out, self._ev(kind, **r.ids(r.item_id), content_index=0, delta=event.text)]

    def text_done(self, reply: int, text: str) -> list[Obj]:
        r = self._responses.get(reply)
        if r is None or r.text_done or r.item_id not in r.outputs:
            return []
        r.text_done = True
        if r.audio:
            return [
                self._ev(
                    "response.output_audio_transcript.done",
                    **r.ids(r.item_id),
                    content_index=0,
                    transcript=text,
                )
            ]
        return [
            self._ev("response.output_text.done", **r.ids(r.item_id), content_index=0, text=text)
        ]

    def _audio_done(self, r: _Response | None) -> list[Obj]:
        if self._playing is r:
            self._playing = None
        if r is None or r.audio_done or not r.audio or r.item_id not in r.outputs:
            return []
        r.audio_done = True
        return [self._ev("response.output_audio.done", **r.ids(r.item_id), content_index=0)]

    def audio(self, pcm: bytes) -> list[Obj]:
        """Reply audio (PCM16 at the session's output rate) as output_audio.delta events of
        the reply playing, in the output format; on a WebRTC call (media "track") only the
        announcement of its message, if it has not been made."""
        r = self._playing or next(reversed(self._responses.values()), None)
        if r is None:
            return []  # audio of no response: a conversation session makes none
        out = self._announce(r)
        if self.wire.media == "track":
            return out  # a WebRTC call's audio goes on its track, not in events
        fmt = self.wire.settings.output_format
        if fmt != "audio/pcm":
            data = self._odd + pcm
            cut = len(data) - len(data) % 2
            self._odd = data[cut:]
            pcm = g711.encode(data[:cut], "ulaw" if fmt == "audio/pcmu" else "alaw")
        delta = b64encode(pcm).decode("ascii")
        return [
            *out,
            self._ev(
                "response.output_audio.delta", **r.ids(r.item_id), content_index=0, delta=delta
            ),
        ]

    def call_delta(self, event: FunctionCallDelta) -> list[Obj]:
        r = self._responses.get(event.reply)
        if r is None:
            return []
        out = []
        if event.item_id not in r.outputs:  # its ItemAdded comes first; this if it did not
            item = Item(
                event.item_id,
                "function_call",
                status="in_progress",
                call_id=event.call_id,
                name=event.name,
                arguments="",
            )
            self._items[event.item_id] = r
            out = self.item_added(item, None)
        call = r.calls.get(event.item_id, (event.call_id, event.name, ""))
        r.calls[event.item_id] = (event.call_id, event.name, call[2] + event.delta)
        out.append(
            self._ev(
                "response.function_call_arguments.delta",
                **r.ids(event.item_id),
                call_id=event.call_id,
                delta=event.delta,
            )
        )
        return out

    def call_done(self, event: FunctionCallDone) -> list[Obj]:
        r = self._responses.get(event.reply)
        if r is None or event.item_id not in r.outputs:
            return []
        return [
            self._ev(
                "response.function_call_arguments.done",
                **r.ids(event.item_id),
                call_id=event.call_id,
                name=event.name,
                arguments=event.arguments,
            )
        ]

    def item_done(self, item: Item, previous: str | None) -> list[Obj]:
        r = self._items.get(item.id)
        out = self._close_output(r, item) if r is not None else []
        if (r is None or r.in_conversation) and not self.wire.beta:
            out.append(
                self._ev(
                    "conversation.item.done",
                    previous_item_id=previous,
                    item=item_dict(item, beta=False),
                )
            )
        return out

    def _close_output(self, r: _Response, item: Item) -> list[Obj]:
        """The done events an output item still lacks, then response.output_item.done."""
        if item.id in r.done:
            return []
        r.done.add(item.id)
        out: list[Obj] = []
        if item.kind == "message":
            out += self._audio_done(r) + self.text_done(r.reply, item.text or "")
            part = (
                {"type": "audio", "transcript": item.text or ""}
                if r.audio
                else {"type": "text", "text": item.text or ""}
            )
            out.append(
                self._ev("response.content_part.done", **r.ids(item.id), content_index=0, part=part)
            )
        out.append(
            self._ev(
                "response.output_item.done",
                response_id=r.id,
                output_index=r.outputs[item.id],
                item=item_dict(item, beta=self.wire.beta),
            )
        )
        return out

    def _unfinished(self, r: _Response, item_id: str) -> Item:
        """An output the response ended without ending (not in its `output`): incomplete."""
        if item_id in r.calls:
            call_id, name, arguments = r.calls[item_id]
            return Item(
                item_id,
                "function_call",
                status="incomplete",
                call_id=call_id,
                name=name,
                arguments=arguments,
            )
        return Item(
            item_id, "message", role="assistant", status="incomplete", audio=r.audio, text=r.sent
        )

    def done(self, event: ResponseDone) -> list[Obj]:
        r = self._responses.get(event.reply)
        if r is None:
            return []
        out: list[Obj] = []
        ended = {item.id: item for item in event.output}
        items = [ended.get(item_id) or self._unfinished(r, item_id) for item_id in r.outputs]
        items += [item for item in event.output if item.id not in r.outputs]
        for item in items:  # each output's done events, in their order
            if item.id in r.outputs:
                out += self._close_output(r, item)
        del self._responses[event.reply]
        for item_id in r.outputs:
            self._items.pop(item_id, None)
        if self._playing is r:
            self._playing = None
        details: Obj | None = None
        if event.status != "completed":
            reason = event.reason if event.reason in STATUS_REASONS else None
            details = {"type": event.status, "reason": reason}
            if event.code is not UNSET:
                details["error"] = {
                    "type": error_type(event.code),
                    "code": event.code,
                    "message": "" if event.message is UNSET else event.message,
                }
        usage = usage_dict(event.usage or Usage())
        output = [item_dict(i, beta=self.wire.beta) for i in items]
        response = self._response_object(
            r, event.status, status_details=details, output=output, usage=usage
        )
        out.append(self._ev("response.done", response=response))
        return out


def usage_dict(usage: Usage) -> Obj:
    """response.done's `usage` in OpenAI's shape (docs/realtime.md, "Usage"). Cached
    tokens are text: voxserve caches no audio."""
    total_in = usage.input_text + usage.input_audio
    total_out = usage.output_text + usage.output_audio
    return {
        "total_tokens": total_in + total_out,
        "input_tokens": total_in,
        "output_tokens": total_out,
        "input_token_details": {
            "text_tokens": usage.input_text,
            "audio_tokens": usage.input_audio,
            "cached_tokens": usage.input_cached,
            "cached_tokens_details": {"text_tokens": usage.input_cached, "audio_tokens": 0},
        },
        "output_token_details": {
            "text_tokens": usage.output_text,
            "audio_tokens": usage.output_audio,
        },
    }


def error_type(code: str) -> str:
    """The Realtime error `type` of a voxserve code."""
    return "invalid_request_error" if code in CLIENT_CODES else "server_error"

"""A Realtime codec pair as the /v1/realtime route builds one, and SDK validation of what
the encoder sends."""

from __future__ import annotations

import json
from typing import Any

from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from voxserve import events as ev
from voxserve.server.realtime_api.codec import RealtimeDecoder
from voxserve.server.realtime_api.events import RealtimeEncoder, server_event_names
from voxserve.server.realtime_api.responses import RateLimit
from voxserve.server.realtime_api.session import Installed, Kind, initial_wire

INSTALLED = Installed(voices=("joe", "amy", "bob"), default_voice="joe", asr_model="whisper")
MAX_MESSAGE = 256 * 1024
GA = TypeAdapter(RealtimeServerEvent)
BETA = TypeAdapter(BetaServerEvent)
LIMITS = (RateLimit("requests", 40, 39, 0.05),)


CONVERSATION_SAMPLES: list[ev.ServerEvent] = [
    ev.SessionUpdated(),
    ev.AudioCommitted(segment=3, item_id="item_su3", previous_item_id="item_x"),
    ev.AudioCleared(),
    ev.ItemAdded(item=ev.Item("item_c1", "message", role="user", text="hi"), previous_item_id=None),
    ev.ItemDone(item=ev.Item("item_c1", "message", role="user", text="hi"), previous_item_id=None),
    ev.ItemDeleted(item_id="item_c1"),
    ev.ItemTruncated(item_id="item_c2", content_index=0, audio_end_ms=1200),
    ev.TranscriptFailed(segment=3, item_id="item_su3", code="engine_error", message="ASR failed"),
    ev.ResponseStarted(
        reply=2, item_id="item_sr2", output_modalities=("text",), voice="joe", in_conversation=False
    ),
    ev.FunctionCallDelta(reply=2, item_id="item_f9", call_id="call_9", name="f", delta="{}"),
    ev.FunctionCallDone(reply=2, item_id="item_f9", call_id="call_9", name="f", arguments="{}"),
    ev.ResponseDone(reply=2, status="failed", code="engine_error", message="boom"),
]
"""One of each conversation event (tests/event_samples.py has the /v1/stream ones)."""


def codec(
    kind: Kind = "realtime", *, beta: bool = False
) -> tuple[RealtimeDecoder, RealtimeEncoder]:
    wire = initial_wire(INSTALLED, model="gpt-realtime", kind=kind, beta=beta, trace_id="t-1")
    return RealtimeDecoder(wire, MAX_MESSAGE), RealtimeEncoder(wire, lambda: LIMITS)


def event(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields})


def checked(texts: list[str], *, beta: bool = False) -> list[dict[str, Any]]:
    """The events as the SDK reads them: each parsed by its pydantic model (voxserve.*
    events are voxserve's additions: not in the SDK), each type one the docs list."""
    events = [json.loads(text) for text in texts]
    for e in events:
        assert e["type"] in server_event_names(beta=beta), e["type"]
        if not e["type"].startswith("voxserve."):
            (BETA if beta else GA).validate_python(e)
    return events

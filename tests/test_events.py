"""The protocol's vocabulary (voxserve/events.py) and its WebSocket encoder: every event type
encodes to the very text the dict it replaced made, and VoxError.to_event gives the error
event the old dict merges (`| {"reply": ...}`) gave."""

from __future__ import annotations

import gc
import json
from typing import Any, get_args

import pytest

from tests.event_samples import SAMPLES
from tests.wsclient import as_read
from voxserve import events as ev
from voxserve.errors import ErrorCode, VoxError
from voxserve.server.session.stream_protocol import encode_event


def legacy_encode(event: dict[str, Any]) -> str:
    """What ws_protocol.encode_event made of an event dict before events were typed."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


def test_every_event_type_has_samples() -> None:
    assert {type(event) for event, _ in SAMPLES} == set(get_args(ev.StreamEvent))


@pytest.mark.parametrize(("event", "legacy"), SAMPLES, ids=[d["type"] for _, d in SAMPLES])
def test_json_is_the_text_the_dicts_made(event: ev.ServerEvent, legacy: dict[str, Any]) -> None:
    text = encode_event(event)
    assert text == legacy_encode(legacy)  # same keys, values, nulls and order
    assert json.loads(text) == legacy
    assert ev.event_type(event) == legacy["type"]


def test_text_that_cannot_be_utf8_fails_before_anything_is_written() -> None:
    """A lone surrogate (a responder's): UnicodeEncodeError, a ValueError, which the
    sender turns into `internal` + session.ended + close 1011."""
    with pytest.raises(ValueError):
        encode_event(ev.ResponseText(reply=0, text="Bad \ud800 reply."))


def test_events_are_frozen_and_not_tracked_by_the_collector() -> None:
    credit = ev.Credit(window=4, acked_seq=None)
    with pytest.raises(AttributeError):
        credit.window = 2  # type: ignore[misc]
    assert not gc.is_tracked(credit)  # gc=False, inherited by every event


def test_every_client_message_has_its_wire_types() -> None:
    assert set(ev.CLIENT_MESSAGE_TYPES.values()) == set(get_args(ev.StreamMessage))


def test_vox_error_to_event_is_the_old_dict_with_its_merges() -> None:
    timeout = VoxError(ErrorCode.STAGE_TIMEOUT, "responder did not finish", stage="responder")
    assert as_read(timeout.to_event(reply=3)) == {
        "type": "error",
        "code": "stage_timeout",
        "message": "responder did not finish",
        "fatal": False,
        "stage": "responder",
        "reply": 3,
    }
    engine = VoxError(ErrorCode.ENGINE_ERROR, "asr failed", stage="asr", retry_after_s=2)
    assert encode_event(engine.to_event(segment=5)) == legacy_encode(
        {
            "type": "error",
            "code": "engine_error",
            "message": "asr failed",
            "fatal": False,
            "stage": "asr",
            "retry_after_ms": 2000,
            "segment": 5,
        }
    )
    internal = VoxError(ErrorCode.INTERNAL, "internal error; see server logs", fatal=True)
    assert encode_event(internal.to_event(trace_id="call-42")) == legacy_encode(
        {
            "type": "error",
            "code": "internal",
            "message": "internal error; see server logs",
            "fatal": True,
            "trace_id": "call-42",
        }
    )


def test_a_refusals_default_retry_time_never_overrides_the_errors_own() -> None:
    """ws_stream's refusal: `retry_after_ms` 1000 unless the error has its own (it was
    `event.setdefault("retry_after_ms", 1000)`)."""
    own = VoxError(ErrorCode.QUOTA_EXCEEDED, "q", fatal=True, retry_after_s=3)
    assert as_read(own.to_event(retry_after_ms=1000)) == {
        "type": "error",
        "code": "quota_exceeded",
        "message": "q",
        "fatal": True,
        "retry_after_ms": 3000,
    }
    bare = VoxError(ErrorCode.NOT_READY, "loading", fatal=True)
    read = as_read(bare.to_event(retry_after_ms=1000))
    assert isinstance(read, dict) and read["retry_after_ms"] == 1000
    assert "retry_after_ms" not in encode_event(bare.to_event())

"""grpc_events: every server event either has its voxserve.v1 message or is one the wire
says it cannot carry; nothing falls through silently (mypy checks the match is exhaustive;
at run time an event outside the union fails loudly)."""

from __future__ import annotations

from typing import get_args

import pytest

from tests.event_samples import SAMPLES
from voxserve import events as ev
from voxserve.server.grpc import events as grpc_events
from voxserve.v1 import voxserve_pb2 as pb

CONVERSE_FIELD: dict[type[ev.ServerEvent], str | None] = {
    ev.SessionStarted: "started",
    ev.SessionResumed: None,  # only the WebSocket parks and resumes sessions
    ev.WakeDetected: None,  # only the WebSocket's session.start takes a wake_word
    ev.SessionUpdated: None,  # no session.update on gRPC (its config holds for the call)
    ev.SessionEnded: "ended",
    ev.VadStart: "vad_start",
    ev.VadEnd: "vad_end",
    ev.TranscriptPartial: "transcript",
    ev.TranscriptFinal: "transcript",
    ev.ResponseDelta: "response_delta",
    ev.ResponseText: "response_text",
    ev.TtsStart: "tts_start",
    ev.TtsEnd: "tts_end",
    ev.TtsFallback: None,  # no message in voxserve.v1; the fallback audio still comes
    ev.BargeIn: "barge_in",
    ev.Mark: "mark",
    ev.Credit: None,  # HTTP/2 flow control paces a gRPC client
    ev.ErrorEvent: "error",
} | {cls: None for cls in get_args(ev.ConversationEvent)}  # only Realtime sessions have them
"""What each event becomes in a Converse stream (None: the wire cannot carry it)."""


def test_the_table_covers_the_union() -> None:
    assert set(CONVERSE_FIELD) == set(get_args(ev.ServerEvent))


@pytest.mark.parametrize("event", [e for e, _ in SAMPLES], ids=[d["type"] for _, d in SAMPLES])
def test_every_event_has_its_message_or_none_on_purpose(event: ev.ServerEvent) -> None:
    converse = grpc_events.encode_event(event, pb.ConverseResponse)
    field = CONVERSE_FIELD[type(event)]
    if field is None:
        assert converse is None
    else:
        assert converse is not None and converse.WhichOneof("event") == field
    recognize = grpc_events.encode_event(event, pb.RecognizeResponse)
    if field is not None and field in pb.RecognizeResponse.DESCRIPTOR.fields_by_name:
        assert recognize is not None and recognize.WhichOneof("event") == field
    else:
        assert recognize is None  # Recognize has no replies, marks or barge-ins


def test_an_event_outside_the_union_is_not_dropped_silently() -> None:
    class Unlisted(ev.Event, frozen=True, tag="future.event"):
        pass

    with pytest.raises(AssertionError):
        grpc_events.encode_event(Unlisted(), pb.ConverseResponse)  # type: ignore[arg-type]


def test_fields_carry_their_values() -> None:
    sample = {type(e): e for e, _ in reversed(SAMPLES)}  # the first of each type
    started = grpc_events.encode_event(sample[ev.SessionStarted], pb.ConverseResponse)
    assert started is not None
    assert (started.started.mode, started.started.output_sample_rate) == (pb.MODE_ASSISTANT, 24000)
    assert started.started.frame_ms == 20 and started.started.trace_id == "call-42"
    ended = grpc_events.encode_event(sample[ev.SessionEnded], pb.RecognizeResponse)
    assert ended is not None and ended.ended.accepted == 98 and ended.ended.rejected == 3
    assert ended.ended.reason == "completed" and ended.ended.duration_ms == 2500
    partial = grpc_events.encode_event(sample[ev.TranscriptPartial], pb.RecognizeResponse)
    assert partial is not None and not partial.transcript.is_final
    assert (partial.transcript.text, partial.transcript.end_ms) == ("good morn", 640)
    cut = ev.TtsEnd(reply=2, chunks=2, audio_ms=400, interrupted=True, underruns=1, played_ms=350)
    end = grpc_events.encode_event(cut, pb.ConverseResponse)
    assert end is not None and end.tts_end.played_ms == 350 and end.tts_end.interrupted
    whole = ev.TtsEnd(reply=0, chunks=5, audio_ms=1800, interrupted=False, underruns=0)
    end = grpc_events.encode_event(whole, pb.ConverseResponse)
    assert end is not None and end.tts_end.played_ms == 0
    mark = grpc_events.encode_event(ev.Mark(id=7, acked_seq=3), pb.ConverseResponse)
    assert mark is not None and mark.mark.id == "7"
    error = ev.ErrorEvent(code="engine_error", message="m", fatal=True, segment=0, trace_id="t")
    encoded = grpc_events.encode_event(error, pb.RecognizeResponse)
    assert encoded is not None and encoded.error.HasField("segment")
    assert encoded.error.segment == 0 and encoded.error.stage == "" and encoded.error.fatal
    negative = grpc_events.encode_event(ev.VadStart(segment=0, start_ms=-5), pb.ConverseResponse)
    assert negative is not None and negative.vad_start.start_ms == 0  # uint32: never below 0

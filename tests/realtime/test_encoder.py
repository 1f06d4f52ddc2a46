"""The Realtime encoder: scripted voxserve event sequences (the order COMMON's contract gives)
-> the Realtime server events, every one parsed by the official SDK's pydantic model, ids
tied together (item_id, response_id, output_index, content_index)."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import numpy as np
import pytest

from tests.event_samples import ASSISTANT_STARTED, SAMPLES
from tests.fakes import FakeAsr, FakeTts, FakeVad
from tests.realtime.helpers import CONVERSATION_SAMPLES, checked, codec, event
from voxserve import events as ev
from voxserve.audio import g711
from voxserve.config import QuotasConfig, VadConfig
from voxserve.engines.loaded import Engines
from voxserve.engines.responders import EchoResponder
from voxserve.errors import ErrorCode
from voxserve.server.realtime_api.codec import RealtimeDecoder
from voxserve.server.realtime_api.events import RealtimeEncoder
from voxserve.server.realtime_api.responses import RateLimit, request_limits
from voxserve.server.realtime_api.session import UPDATE_STAGE, installed_of
from voxserve.server.session.auth import ANONYMOUS
from voxserve.server.session.partials import stable_delta, stable_prefix
from voxserve.server.session.quotas import Quotas

STARTED = ASSISTANT_STARTED  # session.created: the encoder reads only its session id
SID = STARTED.session_id
USER = ev.speech_item_id(SID, 1)
REPLY = ev.reply_item_id(SID, 1)
# How a spoken response closes, in order (after its last audio delta).
AUDIO_REPLY_END = [
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]
AUDIO = (np.arange(480) * 50 % 20000).astype("<i2").tobytes()


def user_item(text: str | None = None) -> ev.Item:
    return ev.Item(USER, "message", role="user", audio=True, text=text)


def reply_item(text: str, status: str = "completed", *, audio: bool = True) -> ev.Item:
    return ev.Item(REPLY, "message", role="assistant", status=status, audio=audio, text=text)


def spoken_turn() -> list[ev.ServerEvent]:
    return [
        ev.VadStart(segment=1, start_ms=100),
        ev.TranscriptPartial(segment=1, text="what is", start_ms=100, end_ms=400),
        ev.TranscriptPartial(segment=1, text="what is the time", start_ms=100, end_ms=700),
        ev.VadEnd(segment=1, start_ms=100, end_ms=900),
        ev.AudioCommitted(segment=1, item_id=USER, previous_item_id=None),
        ev.ItemAdded(item=user_item(), previous_item_id=None),
        ev.TranscriptFinal(
            segment=1, text="what is the time", start_ms=100, end_ms=900, language="en"
        ),
        ev.ItemDone(item=user_item("what is the time"), previous_item_id=None),
    ]


def spoken_reply(modalities: tuple[str, ...] = ("audio",)) -> list[ev.ServerEvent | bytes]:
    audio = modalities == ("audio",)
    events: list[ev.ServerEvent | bytes] = [
        ev.ResponseStarted(
            reply=1, item_id=REPLY, output_modalities=modalities, voice="joe", in_conversation=True
        ),
        ev.ItemAdded(item=reply_item("", "in_progress", audio=audio), previous_item_id=USER),
        ev.ResponseDelta(reply=1, text="It is "),
    ]
    if audio:
        events += [ev.TtsStart(reply=1, voice="joe", sample_rate=24000), AUDIO]
    events.append(ev.ResponseDelta(reply=1, text="noon."))
    if audio:
        events += [AUDIO, ev.TtsEnd(reply=1, chunks=2, audio_ms=40, interrupted=False, underruns=0)]
    final = reply_item("It is noon.", audio=audio)
    return [
        *events,
        ev.ResponseText(reply=1, text="It is noon."),
        ev.ItemDone(item=final, previous_item_id=USER),
        ev.ResponseDone(reply=1, status="completed", output=(final,)),
    ]


def run(
    encoder: RealtimeEncoder, script: list[ev.ServerEvent | bytes], *, beta: bool = False
) -> list[dict[str, Any]]:
    texts: list[str] = []
    for item in script:
        texts += encoder.encode_audio(item) if isinstance(item, bytes) else encoder.encode(item)
    return checked(texts, beta=beta)


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def test_a_spoken_question_answered_with_audio_ga() -> None:
    _, encoder = codec()
    events = run(encoder, [STARTED, *spoken_turn(), *spoken_reply()])
    assert types(events) == [
        "session.created",
        "input_audio_buffer.speech_started",
        "conversation.item.input_audio_transcription.delta",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.done",
        "response.created",
        "rate_limits.updated",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        *AUDIO_REPLY_END,
    ]
    assert len({e["event_id"] for e in events}) == len(events)
    by_type = {e["type"]: e for e in events}
    # the user's turn: one item id from speech start to its transcript
    user_ids = {e["item_id"] for e in events if e["type"].startswith("input_audio_buffer.s")}
    assert user_ids == {USER} == {by_type["input_audio_buffer.committed"]["item_id"]}
    deltas = [
        e["delta"]
        for e in events
        if e["type"] == "conversation.item.input_audio_transcription.delta"
    ]
    assert "".join(deltas) == "what is the time"
    completed = by_type["conversation.item.input_audio_transcription.completed"]
    assert completed["transcript"] == "what is the time" and completed["item_id"] == USER
    assert completed["usage"] == {"type": "duration", "seconds": 0.8}
    # the response: one id, one output at index 0, its part at content index 0
    response_id = by_type["response.created"]["response"]["id"]
    tied = [e for e in events if "response_id" in e]
    assert {e["response_id"] for e in tied} == {response_id}
    assert {e["output_index"] for e in tied} == {0}
    assert {e.get("item_id", REPLY) for e in tied} == {REPLY}
    assert {e["content_index"] for e in tied if "content_index" in e} == {0}
    audio = b"".join(
        base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"
    )
    assert audio == AUDIO * 2
    done = by_type["response.done"]["response"]
    assert done["id"] == response_id and done["status"] == "completed"
    assert done["output"][0]["content"] == [{"type": "output_audio", "transcript": "It is noon."}]
    assert by_type["rate_limits.updated"]["rate_limits"] == [
        {"name": "requests", "limit": 40, "remaining": 39, "reset_seconds": 0.05}
    ]


def test_beta_names_for_a_beta_client() -> None:
    _, encoder = codec(beta=True)
    events = run(encoder, [STARTED, *spoken_turn(), *spoken_reply()], beta=True)
    names = types(events)
    assert "conversation.item.created" in names and "conversation.item.added" not in names
    assert "conversation.item.done" not in names
    assert names.count("response.audio.delta") == 2
    assert {"response.audio_transcript.delta", "response.audio.done"} <= set(names)
    assert "response.audio_transcript.done" in names
    session = events[0]["session"]
    assert session["input_audio_format"] == "pcm16" and session["voice"] == "joe"
    done = events[-1]["response"]
    assert done["output"][0]["content"] == [{"type": "audio", "transcript": "It is noon."}]


def test_a_text_response() -> None:
    _, encoder = codec()
    events = run(encoder, [STARTED, *spoken_reply(("text",))])
    assert [t for t in types(events) if t.startswith("response.")] == [
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    part = next(e for e in events if e["type"] == "response.content_part.done")["part"]
    assert part == {"type": "text", "text": "It is noon."}


def test_a_tool_call_round() -> None:
    _, encoder = codec()
    call = ev.Item(
        "item_f1",
        "function_call",
        status="in_progress",
        call_id="call_1",
        name="get_time",
        arguments="",
    )
    done = ev.Item(
        "item_f1", "function_call", call_id="call_1", name="get_time", arguments='{"tz": "UTC"}'
    )
    script: list[ev.ServerEvent | bytes] = [
        STARTED,
        ev.ResponseStarted(
            reply=1, item_id=REPLY, output_modalities=("audio",), voice="joe", in_conversation=True
        ),
        ev.ItemAdded(item=call, previous_item_id=USER),
        ev.FunctionCallDelta(
            reply=1, item_id="item_f1", call_id="call_1", name="get_time", delta='{"tz": '
        ),
        ev.FunctionCallDelta(
            reply=1, item_id="item_f1", call_id="call_1", name="get_time", delta='"UTC"}'
        ),
        ev.FunctionCallDone(
            reply=1, item_id="item_f1", call_id="call_1", name="get_time", arguments='{"tz": "UTC"}'
        ),
        ev.ItemDone(item=done, previous_item_id=USER),
        ev.ResponseDone(reply=1, status="completed", output=(done,)),
    ]
    events = run(encoder, script)
    assert types(events)[1:] == [
        "response.created",
        "rate_limits.updated",
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    args = [e for e in events if e["type"].startswith("response.function_call_arguments")]
    assert {(e["item_id"], e["call_id"], e["output_index"]) for e in args} == {
        ("item_f1", "call_1", 0)
    }
    assert args[-1]["arguments"] == '{"tz": "UTC"}' and args[-1]["name"] == "get_time"
    output = events[-1]["response"]["output"]
    assert output == [
        {
            "id": "item_f1",
            "object": "realtime.item",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_1",
            "name": "get_time",
            "arguments": '{"tz": "UTC"}',
        }
    ]


def test_a_function_call_the_client_adds_while_a_response_runs_is_not_its_output() -> None:
    _, encoder = codec()
    mine = ev.Item("c1", "function_call", call_id="call_9", name="lookup", arguments="{}")
    script: list[ev.ServerEvent | bytes] = [
        STARTED,
        ev.ResponseStarted(
            reply=1, item_id=REPLY, output_modalities=("audio",), voice="joe", in_conversation=True
        ),
        ev.ItemAdded(item=mine, previous_item_id=USER),  # conversation.item.create meanwhile
        ev.ItemDone(item=mine, previous_item_id=USER),
        ev.ResponseDone(reply=1, status="completed", output=()),
    ]
    events = run(encoder, script)
    assert types(events)[1:] == [
        "response.created",
        "rate_limits.updated",
        "conversation.item.added",
        "conversation.item.done",
        "response.done",
    ]
    assert events[-1]["response"]["output"] == []


def test_barge_in_cuts_the_item_and_cancels_the_response() -> None:
    _, encoder = codec()
    cut = reply_item("It is", "incomplete")
    script: list[ev.ServerEvent | bytes] = [
        STARTED,
        *spoken_reply()[:5],  # started, item added, a delta, tts start, audio
        ev.VadStart(segment=2, start_ms=5000),
        ev.BargeIn(segment=2),
        ev.ItemDone(item=cut, previous_item_id=USER),
        ev.ResponseDone(reply=1, status="cancelled", reason="turn_detected", output=(cut,)),
    ]
    events = run(encoder, script)
    assert types(events)[-7:] == ["input_audio_buffer.speech_started", *AUDIO_REPLY_END]
    transcript = next(e for e in events if e["type"] == "response.output_audio_transcript.done")
    assert transcript["transcript"] == "It is"
    item_done = next(e for e in events if e["type"] == "response.output_item.done")
    assert item_done["item"]["status"] == "incomplete"
    response = events[-1]["response"]
    assert response["status"] == "cancelled"
    assert response["status_details"] == {"type": "cancelled", "reason": "turn_detected"}


def test_a_failed_response_carries_the_error() -> None:
    _, encoder = codec()
    script: list[ev.ServerEvent | bytes] = [
        STARTED,
        ev.ResponseStarted(
            reply=1, item_id=REPLY, output_modalities=("audio",), voice="joe", in_conversation=True
        ),
        ev.ErrorEvent(code="engine_error", message="the responder failed", fatal=False, reply=1),
        ev.ResponseDone(
            reply=1, status="failed", code="engine_error", message="the responder failed"
        ),
    ]
    events = run(encoder, script)
    assert events[3]["error"] == {
        "type": "server_error",
        "code": "engine_error",
        "message": "the responder failed",
        "param": None,
        "event_id": None,
    }
    details = events[-1]["response"]["status_details"]
    assert details == {
        "type": "failed",
        "reason": None,
        "error": {
            "type": "server_error",
            "code": "engine_error",
            "message": "the responder failed",
        },
    }


@pytest.mark.parametrize(("name", "law"), [("audio/pcmu", "ulaw"), ("audio/pcma", "alaw")])
def test_g711_out(name: str, law: str) -> None:
    decoder, encoder = codec()
    run(encoder, [STARTED])
    decoder.decode(
        event("session.update", session={"audio": {"output": {"format": {"type": name}}}})
    )
    updated = run(encoder, [ev.SessionUpdated()])
    assert updated[0]["session"]["audio"]["output"]["format"] == {"type": name}
    events = run(encoder, spoken_reply())
    audio = b"".join(
        base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"
    )
    assert audio == g711.encode(AUDIO * 2, law)  # type: ignore[arg-type]
    created = events[0]["response"]
    assert created["audio"]["output"]["format"] == {"type": name}


def test_input_transcript_deltas_are_append_only_stable_words() -> None:
    _, encoder = codec()
    partials = ["I", "I scream", "ice cream for", "ice cream for every", "ice cream for everyone"]
    script: list[ev.ServerEvent | bytes] = [STARTED]
    script += [ev.TranscriptPartial(segment=1, text=t, start_ms=0, end_ms=500) for t in partials]
    script.append(
        ev.TranscriptFinal(
            segment=1, text="ice cream for everyone today", start_ms=0, end_ms=900, language="en"
        )
    )
    events = run(encoder, script)
    deltas = [
        e["delta"]
        for e in events
        if e["type"] == "conversation.item.input_audio_transcription.delta"
    ]
    # "I " was never stable ("I" then "I scream" then "ice"): nothing sent to correct
    assert deltas == ["ice cream ", "for ", "everyone today"]
    assert events[-1]["transcript"] == "ice cream for everyone today"


def test_a_final_that_corrects_the_sent_words_is_whole_in_completed_only() -> None:
    _, encoder = codec()
    script: list[ev.ServerEvent | bytes] = [
        STARTED,
        ev.TranscriptPartial(segment=1, text="to be or", start_ms=0, end_ms=1),
        ev.TranscriptPartial(segment=1, text="to be or not", start_ms=0, end_ms=2),
        ev.TranscriptFinal(segment=1, text="two bee", start_ms=0, end_ms=3, language="en"),
    ]
    events = run(encoder, script)
    # "or" was last in the first partial: not yet followed by a space, not yet stable
    assert [e.get("delta") for e in events[1:]] == ["to be ", None]
    assert events[-1]["transcript"] == "two bee"


def test_stable_prefix() -> None:
    assert stable_prefix("", "hello") == ""
    assert stable_prefix("hello wor", "hello world") == "hello "
    assert stable_prefix("a b c", "a b c") == "a b "
    assert stable_prefix("x y", "z y") == ""


def test_stable_delta_adds_only_agreed_words_past_what_was_sent() -> None:
    assert stable_delta("turn on the", "turn on the lights", "") == "turn on "
    assert stable_delta("turn on the", "turn on the lights", "turn ") == "on "
    assert stable_delta("turn on the", "turn on the lights", "turn on ") == ""
    assert stable_delta("turn of the", "turn of the lights", "turn on ") == ""  # never retracted


def test_no_transcription_events_when_transcription_is_off() -> None:
    decoder, encoder = codec()
    session = {"audio": {"input": {"transcription": None}}}
    run(encoder, [STARTED])
    decoder.decode(event("session.update", session=session))
    events = run(encoder, [ev.SessionUpdated(), *spoken_turn()])
    assert events[0]["session"]["audio"]["input"]["transcription"] is None
    assert not [e for e in events if "transcription" in e["type"]]


def test_an_error_carries_the_client_event_id_of_a_decoder_refusal() -> None:
    decoder, encoder = codec()
    run(encoder, [STARTED])
    for raw in (event("bogus", event_id="evt_a"), event("nope", event_id="evt_b")):
        try:
            decoder.decode(raw)
        except Exception as exc:  # VoxError: the driver reports it as an ErrorEvent
            errors = [exc.to_event()]  # type: ignore[attr-defined]
    first = ev.ErrorEvent(
        code="invalid_message", message="unknown client event type 'bogus'", fatal=False
    )
    events = run(encoder, [first, *errors])
    assert [e["error"]["event_id"] for e in events] == ["evt_a", "evt_b"]
    assert events[0]["error"]["type"] == "invalid_request_error"
    assert not decoder.wire.refusals


def test_a_refused_update_is_dropped_and_the_next_one_applies() -> None:
    decoder, encoder = codec()
    run(encoder, [STARTED])
    language = {"audio": {"input": {"transcription": {"language": "xx"}}}}
    decoder.decode(event("session.update", event_id="evt_1", session=language))
    decoder.decode(event("session.update", event_id="evt_2", session={"instructions": "Hi"}))
    unrelated = ev.ErrorEvent(code="empty_audio", message="nothing to commit", fatal=False)
    refusal = ev.ErrorEvent(
        code=ErrorCode.UNKNOWN_LANGUAGE.value,
        message="language 'xx' is not served",
        fatal=False,
        stage=UPDATE_STAGE,
    )
    events = run(encoder, [unrelated, refusal])
    assert [e["error"]["event_id"] for e in events] == [None, "evt_1"]
    assert len(decoder.wire.pending) == 1
    # the second was merged onto the first (in the client's order): the session refuses it
    # as well, and the settings in force are still the opening ones
    events = run(encoder, [refusal, ev.SessionUpdated()])
    assert events[0]["error"]["event_id"] == "evt_2"
    assert events[1]["session"]["instructions"] == ""
    assert events[1]["session"]["audio"]["input"]["transcription"]["language"] is None
    assert not decoder.wire.pending


def test_a_delta_before_its_item_announces_the_message() -> None:
    _, encoder = codec()
    started, added, delta = spoken_reply()[:3]
    events = run(encoder, [STARTED, started, delta, added])
    assert types(events)[3:] == [
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
    ]


def test_transcription_session_objects() -> None:
    _, encoder = codec("transcription")
    events = run(encoder, [STARTED, ev.SessionUpdated()])
    session = events[0]["session"]
    assert session["type"] == "transcription"
    assert session["audio"]["input"]["transcription"]["model"] == "whisper"
    assert session["audio"]["input"]["turn_detection"]["create_response"] is False
    decoder, beta = codec("transcription", beta=True)
    run(beta, [STARTED], beta=True)
    # beta's model names the transcription model from a list: the client's name is reported
    transcription = {"input_audio_transcription": {"model": "whisper-1"}}
    decoder.decode(event("transcription_session.update", session=transcription))
    events = run(beta, [STARTED, ev.SessionUpdated()], beta=True)
    assert types(events) == ["session.created", "transcription_session.updated"]


def test_every_voxserve_event_encodes_to_events_the_sdk_reads() -> None:
    """Each sample of every ServerEvent (tests/event_samples.py), after a response is open."""
    for beta in (False, True):
        _, encoder = codec(beta=beta)
        run(encoder, [STARTED, *spoken_reply()[:2]], beta=beta)
        for sample in [sample for sample, _ in SAMPLES] + CONVERSATION_SAMPLES:
            run(encoder, [sample], beta=beta)


def test_session_ended_and_tts_fallback_are_voxserve_events() -> None:
    _, encoder = codec()
    ended = next(e for e, _ in SAMPLES if isinstance(e, ev.SessionEnded))
    fallback = ev.TtsFallback(reply=1, reason="slow", text="One moment.")
    events = run(encoder, [STARTED, *spoken_reply()[:2], ended, fallback])
    assert events[-2]["type"] == "voxserve.session.ended"
    assert events[-2]["segments"] == ended.segments
    assert events[-1] == {
        "event_id": events[-1]["event_id"],
        "type": "voxserve.tts.fallback",
        "response_id": events[1]["response"]["id"],
        "reason": "slow",
        "text": "One moment.",
    }


def test_rate_limits_are_the_keys_request_and_audio_quotas() -> None:
    now = [100.0]
    config = QuotasConfig(anonymous=True)
    quotas = Quotas(config, clock=lambda: now[0])
    quotas.request("k")
    quotas.charge_audio("k", 60.0)
    per_min = config.default.audio_s_per_min
    assert per_min
    # tokens: the audio quota as a user's audio tokens, 10 a second (1 per 100 ms)
    assert request_limits(quotas, "k") == (
        RateLimit("requests", 40, 39, 0.05),
        RateLimit("tokens", int(per_min * 10), int((per_min - 60) * 10), 60 / (per_min / 60)),
    )
    disabled = Quotas(QuotasConfig(enabled=False))
    assert request_limits(disabled, ANONYMOUS) == ()


def test_json_text_matches_the_dicts() -> None:
    decoder, encoder = codec()
    assert isinstance(decoder, RealtimeDecoder)
    text = encoder.encode(STARTED)
    assert json.loads(text[0])["session"]["id"] == f"sess_{SID}"


def test_a_response_that_ends_without_ending_its_outputs_closes_them_incomplete() -> None:
    _, encoder = codec()
    started, added, delta = spoken_reply()[:3]
    call = ev.FunctionCallDelta(reply=1, item_id="item_f1", call_id="call_1", name="f", delta="{")
    done = ev.ResponseDone(reply=1, status="cancelled", reason="client_cancelled")
    events = run(encoder, [STARTED, started, added, delta, call, done])
    closed = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(i["id"], i["status"]) for i in closed] == [
        (REPLY, "incomplete"),
        ("item_f1", "incomplete"),
    ]
    assert closed[0]["content"] == [{"type": "output_audio", "transcript": "It is "}]
    assert closed[1]["arguments"] == "{"
    response = events[-1]["response"]
    assert response["status_details"]["reason"] == "client_cancelled"
    assert response["output"] == closed


def test_conversation_events_become_their_realtime_events() -> None:
    _, encoder = codec()
    run(encoder, [STARTED])
    events = run(encoder, CONVERSATION_SAMPLES[1:8])
    assert types(events) == [
        "input_audio_buffer.committed",
        "input_audio_buffer.cleared",
        "conversation.item.added",
        "conversation.item.done",
        "conversation.item.deleted",
        "conversation.item.truncated",
        "conversation.item.input_audio_transcription.failed",
    ]
    assert events[0]["previous_item_id"] == "item_x"
    assert events[2]["item"]["content"] == [{"type": "input_text", "text": "hi"}]
    assert events[5]["audio_end_ms"] == 1200
    assert events[6]["error"]["code"] == "engine_error" and events[6]["item_id"] == "item_su3"


def test_an_out_of_band_response_adds_nothing_to_the_conversation() -> None:
    _, encoder = codec()
    run(encoder, [STARTED])
    started = CONVERSATION_SAMPLES[8]
    item = ev.Item("item_sr2", "message", role="assistant", status="in_progress")
    events = run(encoder, [started, ev.ItemAdded(item=item, previous_item_id=None)])
    assert events[0]["response"]["conversation_id"] is None
    assert types(events)[2:] == ["response.output_item.added", "response.content_part.added"]


def test_what_the_server_has() -> None:
    engines = Engines(FakeVad(), FakeAsr(), [FakeTts()], EchoResponder(), default_voice="fake")
    installed = installed_of(engines, VadConfig(threshold=0.4, pad_ms=150, hangover_ms=600))
    assert installed.voices == ("fake",) and installed.default_voice == "fake"
    assert (installed.vad_threshold, installed.vad_prefix_padding_ms) == (0.4, 150)
    assert installed.vad_silence_duration_ms == 600
    assert installed.asr_model == (FakeAsr.info.model or FakeAsr.info.name)


def test_semantic_vad_is_echoed_with_its_eagerness_in_session_updated() -> None:
    """The SDK's own model of session.updated reads it (checked), with OpenAI's fields for
    semantic_vad: type, eagerness, create_response, interrupt_response."""
    decoder, encoder = codec()
    run(encoder, [STARTED])
    td = {"type": "semantic_vad", "eagerness": "high"}
    decoder.decode(event("session.update", session={"audio": {"input": {"turn_detection": td}}}))
    (updated,) = run(encoder, [ev.SessionUpdated()])
    assert updated["session"]["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad",
        "eagerness": "high",
        "create_response": True,
        "interrupt_response": True,
    }


@pytest.mark.parametrize("beta", [False, True])
def test_a_server_started_response_has_null_metadata_and_the_clients_voice_name(
    beta: bool,
) -> None:
    """A response the server started (a spoken turn) has no metadata; each response names
    its voice as the client did (beta: `voice`, GA: `audio.output.voice`)."""
    _, encoder = codec(beta=beta)
    script = spoken_reply()
    script[0] = msgspec.structs.replace(script[0], voice_name="alloy")  # type: ignore[type-var]
    events = run(encoder, [STARTED, *script], beta=beta)
    for kind in ("response.created", "response.done"):
        (response,) = [e["response"] for e in events if e["type"] == kind]
        assert response["metadata"] is None
        voice = response["voice"] if beta else response["audio"]["output"]["voice"]
        assert voice == "alloy"
    usage = response["usage"]  # the last one: response.done
    assert usage["output_tokens"] == usage["total_tokens"] == 0  # no usage given: zeros

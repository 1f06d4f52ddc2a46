"""The Realtime decoder: every client event, GA and beta names, into voxserve's messages and
numbered 20 ms frames; every refusal with its code, never fatal, remembered with the
client's event_id."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest

from tests.realtime.helpers import MAX_MESSAGE, codec, event
from voxserve.audio import g711
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import (
    CancelMessage,
    ClearAudio,
    CommitAudio,
    CreateItem,
    CreateResponse,
    DeleteItem,
    SessionUpdate,
    ToolSpec,
    TruncateItem,
    TurnDetection,
)
from voxserve.server.realtime_api.codec import REFUSED, RealtimeDecoder
from voxserve.server.session.input import BadAudio


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def pcm(samples: int, start: int = 0) -> bytes:
    return (np.arange(start, start + samples) % 3000).astype("<i2").tobytes()


def refused(decoder: RealtimeDecoder, raw: str | bytes) -> VoxError:
    with pytest.raises((VoxError, BadAudio)) as caught:
        decoder.decode(raw)
    error = caught.value.error if isinstance(caught.value, BadAudio) else caught.value
    assert isinstance(error, VoxError)
    assert not error.fatal
    return error


# --- audio ---------------------------------------------------------------------------------


def test_pcm_is_cut_into_numbered_20ms_frames_and_a_short_tail_waits() -> None:
    decoder, _ = codec()
    audio = pcm(480 * 2 + 20)  # two 20 ms frames at 24 kHz and 20 samples
    frames = decoder.decode(event("input_audio_buffer.append", audio=b64(audio)))
    assert isinstance(frames, list)
    assert [seq for seq, _ in frames] == [0, 1]
    assert [bytes(f) for _, f in frames] == [audio[:960], audio[960:1920]]
    more = pcm(460, start=980)  # completes the third frame exactly
    frames = decoder.decode(event("input_audio_buffer.append", audio=b64(more)))
    assert isinstance(frames, list)
    assert [(seq, bytes(f)) for seq, f in frames] == [(2, audio[1920:] + more)]


def test_an_append_under_a_frame_gives_no_frame_yet_and_nothing_is_lost() -> None:
    decoder, _ = codec()
    sent = b""
    got = b""
    for i in range(7):
        chunk = pcm(100, start=i * 100)
        sent += chunk
        frames = decoder.decode(event("input_audio_buffer.append", audio=b64(chunk)))
        assert isinstance(frames, list)
        got += b"".join(bytes(f) for _, f in frames)
    assert got == sent[:960]  # one whole frame; the 220 samples left wait for more


def test_clear_drops_the_held_tail_commit_keeps_it() -> None:
    decoder, _ = codec()
    decoder.decode(event("input_audio_buffer.append", audio=b64(pcm(100))))
    assert decoder.decode(event("input_audio_buffer.commit")) == CommitAudio()
    frames = decoder.decode(event("input_audio_buffer.append", audio=b64(pcm(380))))
    assert isinstance(frames, list) and len(frames) == 1  # 100 held + 380 = one frame
    decoder.decode(event("input_audio_buffer.append", audio=b64(pcm(100))))
    assert decoder.decode(event("input_audio_buffer.clear")) == ClearAudio()
    frames = decoder.decode(event("input_audio_buffer.append", audio=b64(pcm(380))))
    assert frames == []


@pytest.mark.parametrize(("name", "law"), [("audio/pcmu", "ulaw"), ("audio/pcma", "alaw")])
def test_g711_is_decoded_to_pcm16_at_8khz(name: str, law: str) -> None:
    decoder, _ = codec()
    update = decoder.decode(
        event(
            "session.update",
            session={"type": "realtime", "audio": {"input": {"format": {"type": name}}}},
        )
    )
    assert isinstance(update, SessionUpdate)
    assert update.config.sample_rate == 8000 and update.config.encoding == "pcm_s16le"
    codes = bytes(range(256)) + bytes(range(64))  # 320 samples: two 20 ms frames at 8 kHz
    frames = decoder.decode(event("input_audio_buffer.append", audio=b64(codes)))
    assert isinstance(frames, list)
    assert [len(f) for _, f in frames] == [320, 320]
    assert b"".join(bytes(f) for _, f in frames) == g711.decode(codes, law)  # type: ignore[arg-type]


def test_seq_ids_continue_across_appends() -> None:
    decoder, _ = codec()
    seqs = []
    for _ in range(3):
        frames = decoder.decode(event("input_audio_buffer.append", audio=b64(pcm(960))))
        assert isinstance(frames, list)
        seqs += [seq for seq, _ in frames]
    assert seqs == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("audio", "code"),
    [
        ("not base64!", ErrorCode.INVALID_AUDIO),
        ("AAA", ErrorCode.INVALID_AUDIO),  # bad padding
        (b64(b"\x01\x02\x03"), ErrorCode.ODD_LENGTH_PCM),
        ("", ErrorCode.EMPTY_AUDIO),
        (5, ErrorCode.INVALID_MESSAGE),
        (None, ErrorCode.INVALID_MESSAGE),
    ],
)
def test_bad_audio_is_refused_as_bad_audio(audio: Any, code: ErrorCode) -> None:
    decoder, _ = codec()
    raw = json.dumps({"type": "input_audio_buffer.append", "event_id": "evt_9", "audio": audio})
    with pytest.raises(BadAudio) as caught:
        decoder.decode(raw)
    assert caught.value.error.code is code
    assert decoder.last_event_id == "evt_9"
    assert decoder.wire.refusals[-1] == (code.value, caught.value.error.message, "evt_9")


def outcome(decode: Any, raw: str) -> tuple[Any, ...]:
    """Frames (seq, bytes) or the refusal's code and message."""
    try:
        frames = decode(raw)
    except BadAudio as bad:
        return ("refused", bad.error.code, bad.error.message)
    except VoxError as exc:
        return ("refused", exc.code, exc.message)
    return ("frames", [(seq, bytes(f)) for seq, f in frames])


AUDIO = b64(pcm(480))


def append(audio: str, rest: str = "") -> str:
    """An append as the bench client writes it (no spaces), `rest` before its last brace."""
    return '{"type":"input_audio_buffer.append","audio":"' + audio + '"' + rest + "}"


@pytest.mark.parametrize(
    "raw",
    [
        append(AUDIO),
        event("input_audio_buffer.append", event_id="evt_1", audio=AUDIO),  # spaces, an id
        append(b64(pcm(480 * 3 + 7))),  # frames and a tail
        append("AAAA="),  # padding past the last quantum: binascii takes it (odd length)
        append("AAAA===="),
        append(AUDIO.replace("/", "\\/")),  # an escaped slash is still base64
        append("not base64!"),
        append(""),
        append("AAAA", ',"audio":"' + AUDIO + '"'),  # the last one counts
        append(AUDIO, ',"extra":[1]'),
        append(AUDIO, ',"event_id":7'),
        event("input_audio_buffer.append", event_id="e" * 65, audio=AUDIO),
        event("input_audio_buffer.append", event_id="\ud800", audio=AUDIO),
        append(AUDIO) + " 1",
        append(AUDIO, ',"x":NaN'),
    ],
)
def test_the_append_fast_path_decodes_and_refuses_as_the_general_path(raw: str) -> None:
    fast, _ = codec()
    general, _ = codec()
    for _ in range(2):  # the second time with the first one's tail held
        assert outcome(fast.decode, raw) == outcome(general.decode_event, raw)
        assert fast.last_event_id == general.last_event_id


# --- session.update ------------------------------------------------------------------------


GA_UPDATE = {
    "type": "realtime",
    "model": "gpt-realtime",
    "instructions": "Be brief.",
    "output_modalities": ["text"],
    "max_output_tokens": 200,
    "tools": [
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "audio": {
        "input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "transcription": {"model": "gpt-4o-transcribe", "language": "de", "prompt": "x"},
            "turn_detection": {
                "type": "server_vad",
                "threshold": 0.6,
                "prefix_padding_ms": 300,
                "silence_duration_ms": 700,
                "create_response": False,
                "interrupt_response": False,
            },
            "noise_reduction": None,
        },
        "output": {"format": {"type": "audio/pcmu"}, "voice": "ash", "speed": 1.25},
    },
}


def test_a_ga_session_update_becomes_the_whole_new_config() -> None:
    decoder, _ = codec()
    update = decoder.decode(event("session.update", event_id="evt_1", session=GA_UPDATE))
    assert isinstance(update, SessionUpdate)
    config = update.config
    assert (config.mode, config.sample_rate, config.output_sample_rate) == (
        "assistant",
        24000,
        8000,
    )
    assert config.voice == "amy"  # ash: the second OpenAI name, the next installed voice
    assert (config.language, config.speed, config.trace_id) == ("de", 1.25, "t-1")
    conversation = config.conversation
    assert conversation is not None and conversation.responds and conversation.transcribe
    assert conversation.turn_detection == TurnDetection(0.6, 300, 700, False, False)
    response = conversation.response
    assert response.instructions == "Be brief."
    assert response.output_modalities == ("text",)
    assert response.max_output_tokens == 200
    assert response.tool_choice == "get_weather"
    assert response.tools == (
        ToolSpec(
            "get_weather",
            "The weather",
            {"type": "object", "properties": {"city": {"type": "string"}}},
        ),
    )
    assert not decoder.wire.beta
    assert decoder.wire.pending[-1].event_id == "evt_1"


def test_a_partial_update_keeps_what_it_does_not_name() -> None:
    decoder, _ = codec()
    decoder.decode(event("session.update", session=GA_UPDATE))
    update = decoder.decode(event("session.update", session={"instructions": "Be long."}))
    assert isinstance(update, SessionUpdate)
    conversation = update.config.conversation
    assert conversation is not None
    assert conversation.response.instructions == "Be long."
    assert conversation.response.output_modalities == ("text",)
    assert update.config.output_sample_rate == 8000


def test_null_turn_detection_is_push_to_talk_and_null_transcription_turns_it_off() -> None:
    decoder, _ = codec()
    session = {
        "type": "realtime",
        "audio": {"input": {"turn_detection": None, "transcription": None}},
    }
    update = decoder.decode(event("session.update", session=session))
    assert isinstance(update, SessionUpdate)
    conversation = update.config.conversation
    assert conversation is not None
    assert conversation.turn_detection is None and not conversation.transcribe


def test_semantic_vad_is_taken_with_its_eagerness() -> None:
    decoder, _ = codec()
    session = {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "low"}}}}
    update = decoder.decode(event("session.update", session=session))
    assert isinstance(update, SessionUpdate)
    assert update.config.conversation is not None
    assert update.config.conversation.turn_detection == TurnDetection(
        type="semantic_vad", eagerness="low"
    )


@pytest.mark.parametrize(
    ("turn_detection", "named"),
    [
        ({"type": "semantic_vad", "eagerness": "fast"}, "turn_detection.eagerness"),
        ({"type": "semantic_vad", "silence_duration_ms": 300}, "silence_duration_ms"),
        ({"type": "server_vad", "eagerness": "high"}, "turn_detection.eagerness"),
        ({"type": "smart_vad"}, "turn_detection.type"),
    ],
)
def test_bad_turn_detection_is_refused_naming_the_field(
    turn_detection: dict[str, object], named: str
) -> None:
    decoder, _ = codec()
    session = {"audio": {"input": {"turn_detection": turn_detection}}}
    with pytest.raises(VoxError) as refused:
        decoder.decode(event("session.update", session=session))
    assert refused.value.code is ErrorCode.INVALID_PARAMETER and named in refused.value.message


def test_a_beta_session_update_is_read_and_the_wire_speaks_beta() -> None:
    decoder, _ = codec()
    session = {
        "modalities": ["text", "audio"],
        "voice": "joe",
        "input_audio_format": "g711_alaw",
        "output_audio_format": "g711_ulaw",
        "input_audio_transcription": {"model": "whisper-1", "language": "en"},
        "turn_detection": {"type": "server_vad", "silence_duration_ms": 400},
        "max_response_output_tokens": "inf",
        "temperature": 0.7,
        "tool_choice": "none",
    }
    update = decoder.decode(event("session.update", session=session))
    assert isinstance(update, SessionUpdate)
    assert decoder.wire.beta
    config = update.config
    assert (config.sample_rate, config.output_sample_rate, config.voice) == (8000, 8000, "joe")
    assert config.conversation is not None
    assert config.conversation.turn_detection == TurnDetection(silence_duration_ms=400)
    assert config.conversation.response.output_modalities == ("audio",)
    assert config.conversation.response.tool_choice == "none"
    assert decoder.wire.latest.input_format == "audio/pcma"


def test_transcription_intent_never_responds_and_takes_the_beta_update() -> None:
    decoder, _ = codec("transcription")
    assert decoder.wire.config().conversation is not None
    assert not decoder.wire.config().conversation.responds  # type: ignore[union-attr]
    update = decoder.decode(
        event(
            "transcription_session.update",
            session={
                "input_audio_format": "pcm16",
                "input_audio_transcription": {"language": "fr"},
            },
        )
    )
    assert isinstance(update, SessionUpdate)
    assert update.config.language == "fr"
    assert update.config.conversation is not None and not update.config.conversation.responds
    assert decoder.wire.beta


def test_an_unknown_voice_is_refused_and_nothing_is_proposed() -> None:
    decoder, _ = codec()
    raw = event("session.update", session={"audio": {"output": {"voice": "zed"}}})
    assert refused(decoder, raw).code is ErrorCode.UNKNOWN_VOICE
    assert not decoder.wire.pending
    raw = event("response.create", response={"voice": "zed"})
    assert refused(decoder, raw).code is ErrorCode.UNKNOWN_VOICE


def test_an_installed_voice_and_its_alias_are_taken_as_they_are() -> None:
    decoder, _ = codec()
    update = decoder.decode(
        event("session.update", session={"audio": {"output": {"voice": "bob"}}})
    )
    assert isinstance(update, SessionUpdate) and update.config.voice == "bob"


# --- items and responses -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            CreateItem("message", role="user", text="hi"),
        ),
        (
            {
                "id": "item_1",
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "a"},
                    {"type": "input_audio", "transcript": "b"},
                ],
            },
            CreateItem("message", "item_1", role="user", text="a b"),
        ),
        (
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "ok"}],
            },
            CreateItem("message", role="assistant", text="ok"),
        ),
        (
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "audio", "transcript": "ok"}],
            },
            CreateItem("message", role="assistant", text="ok"),
        ),
        (
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "s"}]},
            CreateItem("message", role="system", text="s"),
        ),
        (
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            CreateItem("function_call", call_id="c1", name="f", arguments="{}"),
        ),
        (
            {"type": "function_call_output", "call_id": "c1", "output": '{"t": 20}'},
            CreateItem("function_call_output", call_id="c1", output='{"t": 20}'),
        ),
    ],
)
def test_conversation_item_create(item: dict[str, Any], expected: CreateItem) -> None:
    decoder, _ = codec()
    assert decoder.decode(event("conversation.item.create", item=item)) == expected


def test_item_create_after_an_item() -> None:
    decoder, _ = codec()
    item = {"type": "function_call_output", "call_id": "c1", "output": "x"}
    message = decoder.decode(
        event("conversation.item.create", previous_item_id="item_7", item=item)
    )
    assert isinstance(message, CreateItem) and message.previous_item_id == "item_7"


def test_delete_truncate_cancel() -> None:
    decoder, _ = codec()
    assert decoder.decode(event("conversation.item.delete", item_id="i1")) == DeleteItem("i1")
    truncate = event("conversation.item.truncate", item_id="i1", content_index=0, audio_end_ms=1500)
    assert decoder.decode(truncate) == TruncateItem("i1", 0, 1500)
    assert decoder.decode(event("response.cancel")) == CancelMessage()
    assert decoder.decode(event("response.cancel", response_id="resp_1")) == CancelMessage()


def test_response_create_overrides_ga_and_beta() -> None:
    decoder, _ = codec()
    assert decoder.decode(event("response.create")) == CreateResponse()
    ga = decoder.decode(
        event(
            "response.create",
            response={
                "instructions": "Say hi",
                "output_modalities": ["text"],
                "conversation": "none",
                "audio": {"output": {"voice": "ballad"}},
                "max_output_tokens": 50,
                "tools": [],
                "tool_choice": "required",
                "metadata": {"k": "v"},
            },
        )
    )
    assert isinstance(ga, CreateResponse)
    options = ga.options
    assert options.instructions == "Say hi" and options.output_modalities == ("text",)
    assert not options.in_conversation and options.max_output_tokens == 50
    assert options.voice == "bob" and options.tools == () and options.tool_choice == "required"
    beta = decoder.decode(
        event(
            "response.create",
            response={
                "modalities": ["audio", "text"],
                "voice": "amy",
                "max_response_output_tokens": 9,
            },
        )
    )
    assert isinstance(beta, CreateResponse)
    assert beta.options.output_modalities == ("audio",)
    assert (beta.options.voice, beta.options.max_output_tokens) == ("amy", 9)


# --- refusals ------------------------------------------------------------------------------

BAD: list[tuple[str | bytes, ErrorCode]] = [
    ("{not json", ErrorCode.INVALID_JSON),
    ("[1, 2]", ErrorCode.INVALID_JSON),
    (b"\xff\xfe\x00", ErrorCode.INVALID_JSON),
    ('{"event_id": "e"}', ErrorCode.INVALID_MESSAGE),
    (event("bogus.event"), ErrorCode.INVALID_MESSAGE),
    (event("conversation.item.retrieve", item_id="i1"), ErrorCode.INVALID_MESSAGE),
    (event("output_audio_buffer.clear"), ErrorCode.INVALID_MESSAGE),
    (event("session.update"), ErrorCode.INVALID_MESSAGE),
    (event("session.update", session=[]), ErrorCode.INVALID_MESSAGE),
    (event("session.update", session={"type": "transcription"}), ErrorCode.INVALID_PARAMETER),
    (event("session.update", session={"colour": "red"}), ErrorCode.INVALID_PARAMETER),
    (
        event("session.update", session={"audio": {"input": {"format": {"type": "audio/opus"}}}}),
        ErrorCode.UNSUPPORTED_ENCODING,
    ),
    (
        event(
            "session.update",
            session={"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
        ),
        ErrorCode.UNSUPPORTED_SAMPLE_RATE,
    ),
    (event("session.update", session={"input_audio_format": "opus"}), ErrorCode.INVALID_PARAMETER),
    (
        event("session.update", session={"audio": {"input": {"turn_detection": {"threshold": 2}}}}),
        ErrorCode.INVALID_PARAMETER,
    ),
    (
        event(
            "session.update", session={"audio": {"input": {"turn_detection": {"threshold": "hi"}}}}
        ),
        ErrorCode.INVALID_MESSAGE,
    ),
    (
        event(
            "session.update",
            session={"audio": {"input": {"turn_detection": {"idle_timeout_ms": 5000}}}},
        ),
        ErrorCode.INVALID_PARAMETER,
    ),
    (
        event("session.update", session={"audio": {"output": {"speed": 3}}}),
        ErrorCode.INVALID_PARAMETER,
    ),
    (
        event("session.update", session={"output_modalities": ["audio", "text"]}),
        ErrorCode.INVALID_PARAMETER,
    ),
    (event("session.update", session={"max_output_tokens": 0}), ErrorCode.INVALID_PARAMETER),
    (
        event("session.update", session={"tools": [{"type": "mcp", "server_label": "x"}]}),
        ErrorCode.INVALID_PARAMETER,
    ),
    (event("session.update", session={"tools": [{"type": "function"}]}), ErrorCode.INVALID_MESSAGE),
    (event("session.update", session={"tool_choice": "always"}), ErrorCode.INVALID_PARAMETER),
    (event("transcription_session.update", session={}), ErrorCode.INVALID_PARAMETER),
    (event("conversation.item.create"), ErrorCode.INVALID_MESSAGE),
    (event("conversation.item.create", item={"type": "message"}), ErrorCode.INVALID_MESSAGE),
    (
        event(
            "conversation.item.create",
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": "AAAA"}],
            },
        ),
        ErrorCode.INVALID_PARAMETER,
    ),
    (
        event(
            "conversation.item.create",
            item={"type": "message", "role": "user", "content": [{"type": "input_image"}]},
        ),
        ErrorCode.INVALID_PARAMETER,
    ),
    (
        event("conversation.item.create", item={"type": "function_call_output", "output": "x"}),
        ErrorCode.INVALID_MESSAGE,
    ),
    (event("conversation.item.delete"), ErrorCode.INVALID_MESSAGE),
    (
        event("conversation.item.truncate", item_id="i", content_index=1, audio_end_ms=0),
        ErrorCode.INVALID_PARAMETER,
    ),
    (
        event("conversation.item.truncate", item_id="i", content_index=0, audio_end_ms=-1),
        ErrorCode.INVALID_PARAMETER,
    ),
    (event("response.create", response={"conversation": "conv_9"}), ErrorCode.INVALID_PARAMETER),
    (
        event("response.create", response={"input": [{"type": "item_reference", "id": "i"}]}),
        ErrorCode.INVALID_PARAMETER,
    ),
    (
        event("response.create", response={"output_audio_format": "g711_ulaw"}),
        ErrorCode.INVALID_PARAMETER,
    ),
    (event("response.cancel", response_id=7), ErrorCode.INVALID_MESSAGE),
    ('{"type": "response.cancel", "event_id": 5}', ErrorCode.INVALID_MESSAGE),
]


@pytest.mark.parametrize(("raw", "code"), BAD)
def test_bad_client_events_get_a_code_and_are_not_fatal(raw: str | bytes, code: ErrorCode) -> None:
    decoder, _ = codec()
    assert refused(decoder, raw).code is code
    assert not decoder.wire.pending  # a refused update proposes nothing


def test_an_oversized_message_is_refused_before_it_is_parsed() -> None:
    decoder, _ = codec()
    audio = b64(pcm(MAX_MESSAGE))
    assert (
        refused(decoder, event("input_audio_buffer.append", audio=audio)).code
        is ErrorCode.MESSAGE_TOO_LARGE
    )


def test_refusals_name_the_event_and_its_id() -> None:
    decoder, _ = codec()
    error = refused(decoder, event("conversation.item.retrieve", event_id="evt_r", item_id="i"))
    assert error.message == REFUSED["conversation.item.retrieve"]
    assert decoder.last_event_id == "evt_r"
    assert list(decoder.wire.refusals) == [("invalid_message", error.message, "evt_r")]
    decoder.decode(event("input_audio_buffer.commit"))
    assert decoder.last_event_id is None


def test_the_decoder_lists_the_events_it_takes() -> None:
    decoder, _ = codec()
    assert set(decoder.event_types) == {
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "session.update",
        "transcription_session.update",
        "conversation.item.create",
        "conversation.item.delete",
        "conversation.item.truncate",
        "response.create",
        "response.cancel",
    }

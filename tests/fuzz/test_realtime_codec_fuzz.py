"""The Realtime decoder (server/realtime_api/codec.py) fed anything: it returns frames or a
message, or raises VoxError (BadAudio around one for audio), never any other exception;
what it returns holds only encodable text, its error messages are short, and its frames
are whole 20 ms frames with consecutive seq ids. Each client event type comes with valid
and hostile fields, so hostile values reach the code past the type switch. One decoder
runs a whole sequence: its state (held audio, the settings proposed) must survive it."""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz.strategies import (
    assert_safe,
    field,
    hostile_text,
    hostile_values,
    json_documents,
    json_values,
    outcome_of,
    utf8,
)
from voxserve.server.realtime_api.codec import RealtimeDecoder
from voxserve.server.realtime_api.session import FORMAT_RATES, Installed, initial_wire
from voxserve.server.session.input import BadAudio
from voxserve.types import FRAME_MS

MAX_MESSAGE = 64 * 1024
INSTALLED = Installed(voices=("joe", "amy"), default_voice="joe")


def fresh() -> RealtimeDecoder:
    return RealtimeDecoder(initial_wire(INSTALLED, model="gpt-realtime"), MAX_MESSAGE)


audio_b64 = st.binary(max_size=4000).map(lambda b: base64.b64encode(b).decode())
formats = st.sampled_from(
    [{"type": "audio/pcm", "rate": 24000}, {"type": "audio/pcmu"}, {"type": "audio/pcma"}]
)
turn_detection = st.none() | st.fixed_dictionaries(
    {},
    optional={
        "type": field(st.sampled_from(["server_vad", "semantic_vad"])),
        "threshold": field(st.floats(0, 1)),
        "prefix_padding_ms": field(st.integers(0, 2000)),
        "silence_duration_ms": field(st.integers(20, 2000)),
        "create_response": field(st.booleans()),
        "interrupt_response": field(st.booleans()),
    },
)
ga_session = st.fixed_dictionaries(
    {},
    optional={
        "type": field(st.just("realtime")),
        "instructions": field(st.text(max_size=40)),
        "output_modalities": field(st.sampled_from([["audio"], ["text"]])),
        "max_output_tokens": field(st.integers(1, 4096) | st.just("inf")),
        "tools": field(st.just([{"type": "function", "name": "f", "parameters": {}}])),
        "tool_choice": field(st.sampled_from(["auto", "none", {"type": "function", "name": "f"}])),
        "audio": field(
            st.fixed_dictionaries(
                {},
                optional={
                    "input": field(
                        st.fixed_dictionaries(
                            {},
                            optional={
                                "format": field(formats),
                                "turn_detection": field(turn_detection),
                                "transcription": field(st.just({"language": "en"})),
                            },
                        )
                    ),
                    "output": field(
                        st.fixed_dictionaries(
                            {},
                            optional={
                                "format": field(formats),
                                "voice": field(st.sampled_from(["alloy", "joe", "zzz"])),
                                "speed": field(st.floats(0.25, 1.5)),
                            },
                        )
                    ),
                },
            )
        ),
    },
)
beta_session = st.fixed_dictionaries(
    {},
    optional={
        "input_audio_format": field(st.sampled_from(["pcm16", "g711_ulaw", "g711_alaw"])),
        "voice": field(st.just("ash")),
        "modalities": field(st.sampled_from([["text"], ["text", "audio"]])),
        "turn_detection": field(turn_detection),
        "input_audio_transcription": field(st.none() | st.just({"model": "whisper-1"})),
    },
)
item = st.fixed_dictionaries(
    {"type": field(st.sampled_from(["message", "function_call", "function_call_output"]))},
    optional={
        "id": field(st.text(max_size=10)),
        "role": field(st.sampled_from(["user", "assistant", "system"])),
        "content": field(
            st.lists(
                st.fixed_dictionaries(
                    {"type": field(st.sampled_from(["input_text", "input_audio", "output_text"]))},
                    optional={"text": field(st.text(max_size=20)), "transcript": field(st.text())},
                ),
                max_size=3,
            )
        ),
        "call_id": field(st.text(max_size=10)),
        "name": field(st.text(max_size=10)),
        "arguments": field(st.text(max_size=20)),
        "output": field(st.text(max_size=20)),
    },
)
TYPES = [
    *fresh().event_types,
    "conversation.item.retrieve",  # refused by name
    "output_audio_buffer.clear",  # a WebRTC call's only
    "bogus",
]
events = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("input_audio_buffer.append"), "audio": field(audio_b64)}
    ),
    st.fixed_dictionaries({"type": st.just("session.update"), "session": field(ga_session)}),
    st.fixed_dictionaries({"type": st.just("session.update"), "session": field(beta_session)}),
    st.fixed_dictionaries(
        {"type": st.just("conversation.item.create"), "item": field(item)},
        optional={"previous_item_id": field(st.text(max_size=10))},
    ),
    st.fixed_dictionaries(
        {"type": st.just("conversation.item.truncate")},
        optional={
            "item_id": field(st.text(max_size=8)),
            "content_index": field(st.integers()),
            "audio_end_ms": field(st.integers()),
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("response.create")},
        optional={
            "response": field(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "output_modalities": field(st.just(["text"])),
                        "conversation": field(st.just("none")),
                        "voice": field(st.just("nova")),
                        "instructions": field(st.text(max_size=20)),
                    },
                )
            )
        },
    ),
    st.fixed_dictionaries(
        {"type": field(st.sampled_from(TYPES))},
        optional={
            "event_id": field(st.text(max_size=70)),
            "item_id": field(st.text(max_size=8)),
            "response_id": field(st.text(max_size=8)),
        },
    ),
    st.dictionaries(st.text(max_size=10), json_values | hostile_values, max_size=4),
)


def _decode(decoder: RealtimeDecoder, raw: str | bytes) -> object:
    """The decoder's outcome: frames, a message, or the VoxError it raised (unwrapped from
    BadAudio); any other exception fails the test."""
    try:
        return outcome_of(decoder.decode, raw)
    except BadAudio as bad:
        return bad.error


def _check(decoder: RealtimeDecoder, outcome: object, next_seq: int) -> int:
    assert_safe(outcome)
    if isinstance(outcome, list):
        rate = FORMAT_RATES[decoder.wire.latest.input_format]
        for seq, pcm in outcome:
            assert seq == next_seq
            assert len(pcm) == rate * FRAME_MS // 1000 * 2
            next_seq += 1
    return next_seq


@given(st.lists(events, max_size=12))
@example([{"type": "input_audio_buffer.append", "audio": "AAAA"}] * 3)
@example([{"type": "session.update", "session": {"audio": {"input": {"format": None}}}}])
@example([{"type": "session.update", "session": {"output_modalities": [[]]}}])  # found: TypeError
@example([{"type": "session.update", "session": {"audio": {"input": {"format": {"type": []}}}}}])
@example(
    [
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": {}}]},
        }
    ]
)
@example([{"type": "session.update", "session": {"max_output_tokens": 10**400}}])
@example([{"type": "response.create", "response": {"audio": {"output": {"voice": {"id": 5}}}}}])
def test_a_sequence_of_client_events(sequence: list[dict[str, Any]]) -> None:
    decoder = fresh()
    seq = 0
    for message in sequence:
        seq = _check(decoder, _decode(decoder, json.dumps(message)), seq)


@given(json_documents(events))
def test_client_event_documents(raw: str) -> None:
    """Escaped and raw surrogates, nesting, huge numbers and NaN spliced into events."""
    decoder = fresh()
    seq = _check(decoder, _decode(decoder, raw), 0)
    _check(decoder, _decode(decoder, utf8(raw)), seq)  # the same decoder: its seq goes on


@given(st.text(max_size=2000) | hostile_text)
@example("")
@example("[" * 1000)
@example(json.dumps({"type": "session.update", "session": {"v" * 1000: None}}))
@example('{"type": "session.update", "session": {"instructions": "\\ud800"}}')
def test_any_text(raw: str) -> None:
    decoder = fresh()
    _check(decoder, _decode(decoder, raw), 0)

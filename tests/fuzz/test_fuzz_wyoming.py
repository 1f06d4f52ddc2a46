"""The Wyoming reader (`server/wyoming/protocol.py`), fuzzed like the other wire parsers: any
bytes give events, the end of the stream, or a VoxError, never another exception. The
`wyoming` package's own reader, which this replaced, fails the same property: the
`@example`s below are what it raised on (AttributeError, TypeError, KeyError) and must stay
plain VoxErrors here. Events that pass `check_event` hold only text that can be encoded,
and every error message is short (strategies.assert_safe): the hostile classes of
strategies.py (lone surrogates, deep nesting, huge numbers, long strings) are in every
header and data block generated here."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st
from wyoming.asr import Transcribe
from wyoming.audio import AudioChunk, AudioStart
from wyoming.event import Event
from wyoming.ping import Ping
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart

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
from voxserve.errors import VoxError
from voxserve.server.wyoming.protocol import check_event, merge_data, parse_header, read_event

CAP = 4096
TYPES = [
    "describe",
    "ping",
    "transcribe",
    "audio-start",
    "audio-chunk",
    "audio-stop",
    "synthesize",
    "synthesize-start",
    "synthesize-chunk",
    "synthesize-stop",
    "bogus",
]
DECODERS: dict[str, Any] = {
    "audio-start": AudioStart.from_event,
    "audio-chunk": AudioChunk.from_event,
    "transcribe": Transcribe.from_event,
    "synthesize": Synthesize.from_event,
    "synthesize-start": SynthesizeStart.from_event,
    "synthesize-chunk": SynthesizeChunk.from_event,
    "ping": Ping.from_event,
}
event_data = st.dictionaries(
    st.sampled_from(["rate", "width", "channels", "text", "voice", "language", "name"]),
    json_values
    | hostile_values
    | hostile_text
    | st.integers(-10, 200_000)
    | st.fixed_dictionaries(
        {}, optional={"name": field(st.just("joe")), "language": field(st.just("en"))}
    ),
    max_size=5,
)
headers = st.fixed_dictionaries(
    {"type": st.sampled_from(TYPES) | json_values | hostile_text},
    optional={
        "data": event_data | json_values | hostile_values,
        "data_length": json_values | st.integers(-5, 10_000) | hostile_values,
        "payload_length": json_values | st.integers(-5, 10_000) | hostile_values,
        "version": json_values,
    },
)


@given(st.binary(max_size=3000) | json_documents(headers).map(utf8))
@example(b"[]\n")  # the package's reader: AttributeError
@example(b'{"type": "x", "data_length": "5"}\n')  # TypeError
@example(b'{"data": {}}\n')  # KeyError
@example(b"[" * 50_000)  # nesting past the recursion limit
@example(b'{"type": "x", "payload_length": 1e999}')
@example(b'{"type": "ping", "data": {"a": ' + b"[" * 1000 + b"]" * 1000 + b"}}")
@example(b'{"type": "x", "payload_length": ' + b"9" * 4000 + b"}")  # echoed whole
def test_header_line(line: bytes) -> None:
    """Refusals are safe; what is read may still hold unencodable text, by design:
    check_event refuses it once the event is read whole (the stream stays in step)."""
    outcome = outcome_of(parse_header, line, max_data=CAP, max_payload=CAP)
    if isinstance(outcome, VoxError):
        assert_safe(outcome)


@given(headers)
@example({"type": "x", "data": []})  # the package passed a list on as `data`
@example({"type": "x", "payload_length": -1})
@example({"type": "x", "data_length": True})
def test_header_objects(header: dict[str, Any]) -> None:
    try:
        parsed = parse_header(json.dumps(header).encode(), max_data=CAP, max_payload=CAP)
    except VoxError:
        return
    assert isinstance(parsed.data, dict)
    assert 0 <= parsed.data_length <= CAP and 0 <= parsed.payload_length <= CAP


@given(st.binary(max_size=2000) | json_documents(event_data).map(utf8))
@example(b"[]")
@example(b'{"text": ' + b"[" * 1000 + b"]" * 1000 + b"}")
def test_data_block(raw: bytes) -> None:
    header = parse_header(b'{"type": "x", "data": {"a": 1}}', max_data=CAP, max_payload=CAP)
    try:
        merged = merge_data(header, raw)
    except VoxError:
        return
    assert isinstance(merged, dict)


@given(st.sampled_from(TYPES), event_data)
@example("audio-chunk", {"rate": "16000", "width": 2, "channels": 1})
@example("synthesize", {"text": "hi", "voice": "joe"})
@example("synthesize", {"text": None})
@example("synthesize-start", {"voice": None})  # found: TypeError in SynthesizeVoice.from_dict
@example("synthesize", {"text": "\ud800"})  # found: audio-start, then `internal`
@example("ping", {"text": "\udfff"})  # echoed in the pong: could not be written
@example("synthesize", {"text": "Hi.", "voice": {"name": "\ud800"}})
def test_checked_events_decode(kind: str, data: dict[str, Any]) -> None:
    """What check_event lets through, the package's decoders and the handler can read,
    and can write back (every string encodable)."""
    event = Event(type=kind, data=data, payload=b"\0\0")
    outcome = outcome_of(check_event, event)
    assert_safe(outcome)
    if isinstance(outcome, VoxError):
        return
    if kind in DECODERS:
        assert_safe(data)
    decoder = DECODERS.get(kind)
    if decoder is None:
        return
    decoded = decoder(event)
    if isinstance(decoded, AudioChunk | AudioStart):
        assert decoded.rate > 0 and max(1, decoded.channels) >= 1
    if isinstance(decoded, Synthesize | SynthesizeChunk):
        assert isinstance(decoded.text, str)


event_lines = json_documents(headers).map(lambda header: utf8(header.replace("\n", " ")) + b"\n")


@given(st.binary(max_size=4000) | st.lists(event_lines, max_size=4).map(b"".join))
@example(b'{"type": "ping", "data_length": 3}\n{}')  # data cut short: the peer left
@example(b'{"type": "audio-chunk", "payload_length": 99999}\n')
def test_stream_of_bytes(stream: bytes) -> None:
    async def read_all() -> None:
        reader = asyncio.StreamReader(limit=1024)
        reader.feed_data(stream)
        reader.feed_eof()
        for _ in range(100):
            event = await read_event(reader, max_data=CAP, max_payload=CAP)
            if event is None:
                return
            assert isinstance(event.data, dict)
            checked = outcome_of(check_event, event)  # what the handler does next
            assert_safe(checked)
            if checked is None and event.type in DECODERS:
                assert_safe(event.data)

    assert_safe(outcome_of(asyncio.run, read_all()))

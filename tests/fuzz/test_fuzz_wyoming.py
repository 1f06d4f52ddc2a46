"""The Wyoming reader (`server/wyoming_protocol.py`), fuzzed like the other wire parsers: any
bytes give events, the end of the stream, or a VoxError, never another exception. The
`wyoming` package's own reader, which this replaced, fails the same property: the
`@example`s below are what it raised on (AttributeError, TypeError, KeyError) and must stay
plain VoxErrors here."""

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

from tests.fuzz.test_fuzz_parsers import json_values
from voxserve.errors import VoxError
from voxserve.server.wyoming_protocol import check_event, merge_data, parse_header, read_event

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
headers = st.fixed_dictionaries(
    {"type": st.sampled_from(TYPES) | json_values},
    optional={
        "data": json_values,
        "data_length": json_values | st.integers(-5, 10_000),
        "payload_length": json_values | st.integers(-5, 10_000),
        "version": json_values,
    },
)
event_data = st.dictionaries(
    st.sampled_from(["rate", "width", "channels", "text", "voice", "language", "name"]),
    json_values
    | st.integers(-10, 200_000)
    | st.fixed_dictionaries({}, optional={"name": json_values, "language": json_values}),
    max_size=5,
)


@given(st.binary(max_size=3000))
@example(b"[]\n")  # the package's reader: AttributeError
@example(b'{"type": "x", "data_length": "5"}\n')  # TypeError
@example(b'{"data": {}}\n')  # KeyError
@example(b"[" * 50_000)  # nesting past the recursion limit
@example(b'{"type": "x", "payload_length": 1e999}')
def test_header_line(line: bytes) -> None:
    try:
        parse_header(line, max_data=CAP, max_payload=CAP)
    except VoxError:
        pass


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


@given(st.binary(max_size=2000))
@example(b"[]")
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
def test_checked_events_decode(kind: str, data: dict[str, Any]) -> None:
    """What check_event lets through, the package's decoders and the handler can read."""
    event = Event(type=kind, data=data, payload=b"\0\0")
    try:
        check_event(event)
    except VoxError:
        return
    decoder = DECODERS.get(kind)
    if decoder is None:
        return
    decoded = decoder(event)
    if isinstance(decoded, AudioChunk | AudioStart):
        assert decoded.rate > 0 and max(1, decoded.channels) >= 1
    if isinstance(decoded, Synthesize | SynthesizeChunk):
        assert isinstance(decoded.text, str)


@given(st.binary(max_size=4000))
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

    try:
        asyncio.run(read_all())
    except VoxError:
        pass

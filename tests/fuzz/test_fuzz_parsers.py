"""The wire parsers are pure functions: fed anything, they return a message or raise VoxError
(the client is told the code), never any other exception (which would be a 500 / internal
error and a log line per hostile message). What they return holds only text that can be
encoded, and their error messages are short (strategies.assert_safe): a lone surrogate let
through failed later, as `internal` or a dropped connection, and a 200 KB value echoed into
a message made a 200 KB error. The hostile classes are in strategies.py. Crashes found
here become regression examples (`@example`) on the test that found them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st
from starlette.requests import Request

from tests.fakes import FakeAsr, FakeTts, FakeVad
from tests.fuzz.strategies import (
    assert_safe,
    field,
    hostile_text,
    hostile_values,
    json_documents,
    json_values,
    long_text,
    outcome_of,
    utf8,
)
from voxserve.audio.wav import read_wav, write_wav
from voxserve.config import load_settings
from voxserve.engines.loaded import Engines
from voxserve.engines.responders import EchoResponder
from voxserve.errors import VoxError
from voxserve.server.grpc import codec as grpc_codec
from voxserve.server.grpc.stream import converse_first, recognize_first, recognize_input
from voxserve.server.http.speech import _speech_plan
from voxserve.server.session.http_requests import read_json
from voxserve.server.session.json_input import optional_str
from voxserve.server.session.stream_protocol import parse_audio_frame, parse_text_message
from voxserve.types import SUPPORTED_INPUT_RATES
from voxserve.v1 import voxserve_pb2 as pb

MAX_MESSAGE = 256 * 1024
START_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "sample_rate": st.sampled_from([8000, 16000, 48000]),
    "encoding": st.sampled_from(["pcm_s16le", "pcm16"]),
    "language": st.just("en"),
    "voice": st.just("joe"),
    "output_sample_rate": st.just(16000),
    "speed": st.floats(0.25, 4.0),
    "partials": st.booleans(),
    "chunk_ms": st.integers(160, 4000),
    "trace_id": st.just("call-42"),
    "resumable": st.booleans(),
}
TYPES = [
    "session.start",
    "session.resume",
    "text",
    "audio.end",
    "session.end",
    "cancel",
    "mark",
    "credit",
    "bogus",
]
field_values = (
    json_values | hostile_values | st.sampled_from(["asr", "tts", "assistant", 16000, 1.0])
)
control_messages = st.one_of(
    # Each message type with its fields valid or hostile, so hostile values reach the
    # code past the type switch; then any type with any fields.
    st.fixed_dictionaries(
        {"type": st.just("session.start"), "mode": field(st.sampled_from(["asr", "tts"]))},
        optional={name: field(valid) for name, valid in START_FIELDS.items()},
    ),
    st.fixed_dictionaries(
        {"type": st.just("text"), "text": field(st.text(max_size=40))},
        optional={"flush": field(st.booleans())},
    ),
    st.fixed_dictionaries(
        {"type": st.just("mark"), "id": field(st.integers() | st.text(max_size=64))}
    ),
    st.fixed_dictionaries({"type": st.just("credit"), "audio_ms": field(st.integers(1, 60_000))}),
    st.fixed_dictionaries(
        {"type": st.just("session.resume"), "session_id": field(st.just("0123456789abcdef"))},
        optional={"last_seq": field(st.integers(0, 2**32))},
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(TYPES) | hostile_values},
        optional={
            **{name: field_values for name in ["mode", *START_FIELDS]},
            "text": field_values,
            "flush": field_values,
            "id": field_values,
            "audio_ms": field_values,
            "session_id": field_values,
            "last_seq": field_values,
        },
    ),
)


def _only_vox_errors(call: Any, *args: Any) -> None:
    """The parser's outcome keeps the property (a VoxError or a safe value)."""
    assert_safe(outcome_of(call, *args))


@given(st.text(max_size=2000) | hostile_text)
@example("")
@example("[]")
@example('{"type": "session.start", "mode": "asr", "speed": 1e999}')
@example('{"type": "session.start", "mode": "asr", "encoding": 5}')
@example('{"type": "text", "text": "\\ud800"}')  # found: a str that cannot be encoded
@example('{"type": "mark", "id": "\\udfff"}')  # found: crashed the event writer (1006)
@example("[" * 1000)  # found: RecursionError, "Exception in ASGI application"
def test_control_message_text(raw: str) -> None:
    _only_vox_errors(parse_text_message, raw, MAX_MESSAGE)


@given(control_messages)
@example({"type": "session.start", "mode": "asr", "encoding": None})  # found: AttributeError
@example({"type": "session.start", "mode": "asr", "speed": None})  # found: TypeError
@example({"type": "session.start", "mode": "asr", "voice": "v" * 20_000})  # echoed whole
@example({"type": "session.start", "mode": "asr", "speed": 10**400})  # found: OverflowError
def test_control_message_objects(message: dict[str, Any]) -> None:
    _only_vox_errors(parse_text_message, json.dumps(message), MAX_MESSAGE)


@given(json_documents(control_messages))
def test_control_message_documents(raw: str) -> None:
    """Escaped and raw surrogates, nesting, huge numbers and NaN spliced into messages."""
    _only_vox_errors(parse_text_message, raw, MAX_MESSAGE)


@given(
    st.binary(max_size=20_000),
    st.sampled_from(SUPPORTED_INPUT_RATES),
    st.integers(min_value=1, max_value=400),
)
def test_audio_frame(data: bytes, rate: int, max_frame_ms: int) -> None:
    try:
        seq, pcm = parse_audio_frame(data, rate, max_frame_ms)
    except VoxError:
        return
    assert 0 <= seq < 2**32
    assert len(pcm) % 2 == 0 and len(pcm) > 0


def _request(body: bytes, declared: str | None) -> Request:
    headers = [(b"content-type", b"application/json")]
    if declared is not None:
        headers.append((b"content-length", declared.encode("latin-1")))
    chunks = [body[i : i + 1000] for i in range(0, len(body), 1000)] or [b""]

    async def receive() -> dict[str, Any]:
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers, "query_string": b""}
    return Request(scope, receive)


@given(
    st.binary(max_size=5000),
    st.none() | st.text(st.characters(max_codepoint=255), max_size=12),
    st.integers(0, 6000),
)
@example(b"", "\u00b2", 0)  # found: "²".isdigit() but int() refuses it
def test_http_json_body(body: bytes, declared: str | None, limit: int) -> None:
    assert_safe(outcome_of(asyncio.run, read_json(_request(body, declared), limit)))


speech_bodies = st.fixed_dictionaries(
    {"input": field(st.just("Hello there."))},
    optional={
        "model": field(st.sampled_from(["tts-1", "fake"])),
        "voice": field(st.just("fake")),
        "response_format": field(st.sampled_from(["wav", "pcm"])),
        "stream_format": field(st.just("audio")),
        "speed": field(st.floats(0.25, 4.0)),
        "sample_rate": field(st.sampled_from([16000, 24000])),
    },
)
ENGINES = Engines(
    vad=FakeVad(),
    asr=FakeAsr(),
    tts=[FakeTts()],
    responder=EchoResponder(),
    default_voice="fake",
)
SETTINGS = load_settings()


@given(json_documents(speech_bodies).map(utf8))
@example(b'{"input": "\\ud800"}')  # found: HTTP 500 (the cache key could not be encoded)
@example(b'{"input": "\xed\xa0\x80"}')  # a surrogate as UTF-8 bytes: not valid UTF-8
@example(b"[" * 1000 + b"]" * 1000)  # found: RecursionError, HTTP 500
@example(b'{"input": "Hi.", "voice": "' + b"v" * 200_000 + b'"}')  # found: echoed whole
@example(b'{"input": "Hi.", "speed": 1' + b"0" * 400 + b"}")  # found: OverflowError, a 500
def test_http_speech_body(body: bytes) -> None:
    """The speech route's body, read and planned: a VoxError (a 4xx) or a plan whose text
    can be synthesised, whatever the body holds."""

    async def plan() -> object:
        parsed = await read_json(_request(body, None), MAX_MESSAGE)
        model = optional_str(parsed.get("model"), "model")  # as the route reads it
        return _speech_plan(parsed, ENGINES, SETTINGS, model)

    assert_safe(outcome_of(asyncio.run, plan()))


@given(st.binary(max_size=4000))
@example(b"RIFF\x24\x00\x00\x00WAVEfmt ")
def test_wav_upload(data: bytes) -> None:
    _only_vox_errors(read_wav, data)


@given(st.integers(0, 43), st.binary(min_size=1, max_size=4))
@example(39, b"\x00A")  # found: a data size past the end made wave raise RuntimeError
@example(4, b"\x01")  # found: a RIFF size that leaves half a sample made numpy raise
def test_wav_with_corrupted_header(offset: int, patch: bytes) -> None:
    import numpy as np

    good = bytearray(write_wav(np.zeros(800, dtype=np.int16), 16_000))
    good[offset : offset + len(patch)] = patch
    _only_vox_errors(read_wav, bytes(good))


@given(st.binary(max_size=2000))
@example(b"\xff\xff\xff\xff\x01garbage")  # found: UNKNOWN "Unexpected DecodeError", no code
def test_grpc_requests_from_arbitrary_bytes(data: bytes) -> None:
    """The server's request decoders (what grpc_server registers) never raise: bytes that
    are not a message reach the parsers, which refuse them (invalid_message) like any
    other bad request, as do the unary RPCs."""
    for message_type, parsers in (
        (pb.ConverseRequest, (converse_first, grpc_codec.converse_input)),
        (pb.RecognizeRequest, (recognize_first, recognize_input)),
        (pb.SynthesizeRequest, (grpc_codec.decoded,)),
        (pb.ListVoicesRequest, (grpc_codec.decoded,)),
    ):
        request: Any = grpc_codec.request_decoder(message_type)(data)
        for parse in parsers:
            _only_vox_errors(parse, request)


grpc_text = st.text(max_size=40) | long_text | st.sampled_from(["\x00", "\x1b"])


@given(
    st.builds(
        pb.StreamConfig,
        mode=st.integers(0, 5),
        sample_rate=st.integers(0, 2**31 - 1),
        encoding=grpc_text,
        language=grpc_text,
        voice=grpc_text,
        output_sample_rate=st.integers(0, 2**31 - 1),
        speed=st.floats(width=32),
        chunk_ms=st.integers(0, 2**31 - 1),
        trace_id=grpc_text,
    )
)
@example(pb.StreamConfig(voice="v" * 20_000))  # found: echoed into the trailing metadata
@example(pb.StreamConfig(language="l" * 12_000))
def test_grpc_configs(config: pb.StreamConfig) -> None:
    """Strings from protobuf are valid UTF-8, but any length: refused with short messages."""
    _only_vox_errors(converse_first, pb.ConverseRequest(config=config))
    recognition = pb.RecognitionConfig(language=config.language, encoding=config.encoding)
    _only_vox_errors(recognize_first, pb.RecognizeRequest(config=recognition))

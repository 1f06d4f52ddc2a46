"""The wire parsers are pure functions: fed anything, they return a message or raise VoxError
(the client is told the code), never any other exception (which would be a 500 / internal
error and a log line per hostile message). Crashes found here become regression examples
(`@example`) on the test that found them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from google.protobuf.message import DecodeError
from hypothesis import example, given
from hypothesis import strategies as st
from starlette.requests import Request

from voxserve.audio.wav import read_wav, write_wav
from voxserve.errors import VoxError
from voxserve.server import grpc_codec
from voxserve.server.grpc_stream import converse_first, recognize_first, recognize_input
from voxserve.server.http_requests import read_json
from voxserve.server.ws_protocol import parse_audio_frame, parse_text_message
from voxserve.types import SUPPORTED_INPUT_RATES
from voxserve.v1 import voxserve_pb2 as pb

MAX_MESSAGE = 256 * 1024

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
START_FIELDS = [
    "mode",
    "sample_rate",
    "encoding",
    "language",
    "voice",
    "output_sample_rate",
    "speed",
    "partials",
    "chunk_ms",
    "trace_id",
]
TYPES = ["session.start", "text", "audio.end", "session.end", "cancel", "mark", "bogus"]
control_messages = st.fixed_dictionaries(
    {"type": st.sampled_from(TYPES) | json_values},
    optional={
        **{
            name: json_values | st.sampled_from(["asr", "tts", "assistant", 16000, 1.0])
            for name in START_FIELDS
        },
        "text": json_values,
        "flush": json_values,
        "id": json_values,
    },
)


def _only_vox_errors(call: Any, *args: Any) -> None:
    try:
        call(*args)
    except VoxError:
        pass


@given(st.text(max_size=2000))
@example("")
@example("[]")
@example('{"type": "session.start", "mode": "asr", "speed": 1e999}')
@example('{"type": "session.start", "mode": "asr", "encoding": 5}')
def test_control_message_text(raw: str) -> None:
    _only_vox_errors(parse_text_message, raw, MAX_MESSAGE)


@given(control_messages)
@example({"type": "session.start", "mode": "asr", "encoding": None})  # found: AttributeError
@example({"type": "session.start", "mode": "asr", "speed": None})  # found: TypeError
def test_control_message_objects(message: dict[str, Any]) -> None:
    _only_vox_errors(parse_text_message, json.dumps(message), MAX_MESSAGE)


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
    try:
        asyncio.run(read_json(_request(body, declared), limit))
    except VoxError:
        pass


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
def test_grpc_requests_from_arbitrary_bytes(data: bytes) -> None:
    """grpc decodes the bytes (DecodeError is grpc's to answer); whatever decodes must be
    refused with a VoxError or accepted by the first-message and input parsers."""
    for message_type, parsers in (
        (pb.ConverseRequest, (converse_first, grpc_codec.converse_input)),
        (pb.RecognizeRequest, (recognize_first, recognize_input)),
    ):
        try:
            request: Any = message_type.FromString(data)
        except DecodeError:
            continue
        for parse in parsers:
            _only_vox_errors(parse, request)

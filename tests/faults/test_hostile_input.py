"""Hostile client input, class by class, on every transport of one real server (fake
engines that fail on cue, tests/faults/fakes.py): no class yields a 5xx, `internal`, a
connection dropped without `session.ended`, or a reply begun and never ended.

Classes (docs/reliability.md "Hostile JSON and error hygiene"): lone surrogates (JSON
escapes, a key, UTF-8-encoded bytes), nesting past the parser's recursion limit (closed and
unclosed), huge numbers, NaN, values of 12-200 KB echoed into errors, garbage bytes on gRPC,
audio after the end of input, an engine failing mid-reply, an event that cannot be encoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.conftest import LiveServer
from tests.fakes import SR
from tests.faults.harness import ADMIN_KEY, back_to_baseline, resources, utterances
from tests.transports.grpc_client import collect as grpc_collect
from tests.transports.grpc_client import error_code, of_kind, stub
from tests.wsclient import collect, of_type, send_audio
from voxserve.engines.responders import EchoResponder
from voxserve.pipeline.turns.text_input import TextInput
from voxserve.v1 import voxserve_pb2 as pb

pytestmark = pytest.mark.timeout(60)

# Each class as the raw JSON of one value (what json.dumps cannot write), and its code.
JSON_CLASSES = [
    ("surrogate_escape", '"\\ud800"', "invalid_message"),
    ("surrogate_low", '"voice \\uDFFF"', "invalid_message"),
    ("deep_nesting", "[" * 1000 + "]" * 1000, "invalid_json"),
    ("deep_unclosed", '{"a":' * 3000, "invalid_json"),
    ("huge_integer", "9" * 5000, "invalid_json"),
    ("nan", "NaN", "invalid_json"),
]
SURROGATE_KEY = '{"type": "text", "text": "Hi.", "\\ud800": 1}'
SHORT = 300  # characters an error message may have here: client values are quoted cut short
GARBAGE = b"\xff\xff\xff\xff\x01garbage"  # not a protobuf message of any type


def _ids(cases: list[tuple[str, str, str]]) -> list[str]:
    return [case[0] for case in cases]


async def _events_until_close(ws: Any) -> tuple[list[dict[str, Any]], int | None]:
    events: list[dict[str, Any]] = []
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(10):
            while True:
                message = await ws.recv()
                if isinstance(message, str):
                    events.append(json.loads(message))
    return events, ws.close_code


# -- WebSocket ----------------------------------------------------------------------------


async def test_websocket_mid_session_every_class_is_a_non_fatal_error(
    fault_server: LiveServer,
) -> None:
    """In a text field, in a mark id, in a key: refused with its code, the session goes on
    (marks echoed), ends with session.ended and close 1000."""
    baseline = await resources(fault_server)
    sent: list[tuple[str, str]] = []
    for _, value, code in JSON_CLASSES:
        sent.append((f'{{"type": "text", "text": {value}, "flush": true}}', code))
        sent.append((f'{{"type": "mark", "id": {value}}}', code))
    sent.append((SURROGATE_KEY, "invalid_message"))
    async with connect(fault_server.ws_url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "tts"}))
        assert json.loads(await ws.recv())["type"] == "session.started"
        for message, _ in sent:
            await ws.send(message)
        await ws.send(json.dumps({"type": "mark", "id": "still-here"}))
        await ws.send(json.dumps({"type": "session.end"}))
        events, close_code = await _events_until_close(ws)
    errors = of_type(events, "error")
    assert [(e["code"], e["fatal"]) for e in errors] == [(code, False) for _, code in sent]
    assert all(len(e["message"]) < SHORT for e in errors)
    assert of_type(events, "mark") == [{"type": "mark", "id": "still-here"}]
    assert events[-1]["type"] == "session.ended" and events[-1]["reason"] == "completed"
    assert close_code == 1000
    await back_to_baseline(fault_server, baseline)


@pytest.mark.parametrize(("name", "value", "code"), JSON_CLASSES, ids=_ids(JSON_CLASSES))
async def test_websocket_first_message_every_class_is_refused_1008(
    fault_server: LiveServer, name: str, value: str, code: str
) -> None:
    async with connect(fault_server.ws_url) as ws:
        await ws.send(f'{{"type": "session.start", "mode": "tts", "voice": {value}}}')
        events, close_code = await _events_until_close(ws)
    assert [(e["type"], e["code"], e["fatal"]) for e in events] == [("error", code, True)]
    assert close_code == 1008  # a fatal protocol error; no session, so no session.ended


async def test_websocket_long_value_is_quoted_short(fault_server: LiveServer) -> None:
    async with connect(fault_server.ws_url, max_size=None) as ws:
        start = {"type": "session.start", "mode": "tts", "voice": "v" * 200_000}
        await ws.send(json.dumps(start))
        events, close_code = await _events_until_close(ws)
    assert [e["code"] for e in events] == ["unknown_voice"]
    assert len(events[0]["message"]) < SHORT and "'vvv" in events[0]["message"]
    assert close_code == 1008


async def test_websocket_audio_after_audio_end_is_counted_as_rejected(
    fault_server: LiveServer,
) -> None:
    """received + rejected = sent, also for frames after audio.end (they were refused
    but counted nowhere). The audio ends inside speech, so the session still has a final to
    make when the late frames come (a session with nothing left to do may end before it
    reads them: the client said it was done)."""
    late = 3
    async with connect(fault_server.ws_url) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "asr", "partials": False}))
        assert json.loads(await ws.recv())["type"] == "session.started"
        frames = await send_audio(ws, utterances(500)[: 8 * SR // 10], speedup=5.0)  # ends in it
        await ws.send(json.dumps({"type": "audio.end"}))
        for seq in range(frames, frames + late):
            await ws.send(seq.to_bytes(4, "big") + bytes(640))
        events, _ = await collect(ws)
    ended = events[-1]
    assert [e["code"] for e in of_type(events, "error")] == ["invalid_message"] * late
    assert (ended["received"], ended["rejected"]) == (frames, late)
    assert ended["received"] + ended["rejected"] == frames + late


async def test_websocket_internal_error_closes_1011(
    fault_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the pipeline: `internal` (fatal), session.ended, then close 1011 as the
    protocol says (it closed 1000)."""

    async def broken(self: TextInput) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(TextInput, "run", broken)
    async with connect(fault_server.ws_url) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "tts"}))
        events, close_code = await _events_until_close(ws)
    assert [e["type"] for e in events] == ["session.started", "error", "session.ended"]
    assert (events[1]["code"], events[1]["fatal"]) == ("internal", True)
    assert events[2]["reason"] == "internal"
    assert close_code == 1011


async def test_websocket_event_that_cannot_be_encoded_ends_the_session_1011(
    fault_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event holding a lone surrogate (here from a responder; client text is refused
    on the way in) crashed the sender: close 1006, no session.ended. Now `internal`,
    session.ended, close 1011."""

    async def surrogate_reply(self: EchoResponder, text: str, history: Any) -> AsyncIterator[str]:
        yield "Bad \ud800 reply."

    monkeypatch.setattr(EchoResponder, "respond", surrogate_reply)
    async with connect(fault_server.ws_url) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "assistant"}))
        assert json.loads(await ws.recv())["type"] == "session.started"

        async def speak() -> None:
            with contextlib.suppress(ConnectionClosed):  # the server ends it mid-audio
                await send_audio(ws, utterances(500), speedup=5.0)

        speaking = asyncio.create_task(speak())
        events, close_code = await _events_until_close(ws)
        await speaking
    assert [e["code"] for e in of_type(events, "error")] == ["internal"]
    assert events[-1]["type"] == "session.ended" and events[-1]["reason"] == "internal"
    assert close_code == 1011


# -- HTTP ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "value", "code"), JSON_CLASSES, ids=_ids(JSON_CLASSES))
async def test_http_every_class_is_a_4xx(
    fault_server: LiveServer, name: str, value: str, code: str
) -> None:
    """The speech route and an admin route (the same decoder): 400 with the code."""
    admin = {"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=fault_server.http_url) as http:
        speech = await http.post(
            "/v1/audio/speech",
            content=f'{{"input": {value}}}',
            headers={"Content-Type": "application/json"},
        )
        invalidate = await http.post(
            "/admin/cache/invalidate", content=f'{{"voice": {value}}}', headers=admin
        )
    for response in (speech, invalidate):
        assert (response.status_code, response.json()["error"]["code"]) == (400, code)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"input": "\xed\xa0\x80"}', "invalid_json"),  # a surrogate as bytes: not UTF-8
        (b'{"input": "Hi.", "voice": "' + b"v" * 200_000 + b'"}', "unknown_voice"),
        (b'{"input": "Hi.", "model": "' + b"m" * 200_000 + b'"}', "unknown_model"),
        (b'{"input": "Hi.", "response_format": "' + b"f" * 100_000 + b'"}', "unsupported_encoding"),
        (b'{"input": "Hi.", "sample_rate": ' + b"9" * 4000 + b"}", "unsupported_sample_rate"),
        (b'{"input": "Hi.", "speed": ' + b"9" * 400 + b"}", "invalid_parameter"),
    ],
    ids=[
        "surrogate_bytes",
        "long_voice",
        "long_model",
        "long_format",
        "long_number",
        "number_past_float",
    ],
)
async def test_http_values_are_refused_and_quoted_short(
    fault_server: LiveServer, body: bytes, code: str
) -> None:
    async with httpx.AsyncClient(headers={"Connection": "close"}) as http:
        response = await http.post(
            fault_server.http_url + "/v1/audio/speech",
            content=body,
            headers={"Content-Type": "application/json"},
        )
    assert (response.status_code, response.json()["error"]["code"]) == (400, code)
    assert len(response.content) < 1000  # a 200 KB value was echoed whole


# -- Wyoming ------------------------------------------------------------------------------


async def _wyoming(live: LiveServer, data: bytes) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
    """Send raw bytes, then a ping; every event answered (type, data) until the pong, and
    whether the server closed the connection instead."""
    reader, writer = await asyncio.open_connection("127.0.0.1", live.settings.wyoming_port)
    writer.write(data + b'{"type": "ping", "data": {"text": "alive"}}\n')
    await writer.drain()
    events: list[tuple[str, dict[str, Any]]] = []
    try:
        async with asyncio.timeout(10):
            while True:
                line = await reader.readline()
                if not line:
                    return events, True
                header = json.loads(line)
                extra = await reader.readexactly(header.get("data_length") or 0)
                await reader.readexactly(header.get("payload_length") or 0)
                data = {**(header.get("data") or {}), **(json.loads(extra) if extra else {})}
                events.append((header["type"], data))
                if header["type"] == "pong":
                    return events, False
    finally:
        writer.close()


def _stream_goes_on(code: str) -> bool:
    """Text that cannot be encoded is a field error (the event was read whole); the other
    classes make the header or data block unreadable, which ends the connection."""
    return code == "invalid_message"


@pytest.mark.parametrize(("name", "value", "code"), JSON_CLASSES, ids=_ids(JSON_CLASSES))
@pytest.mark.parametrize("where", ["header", "data_block"])
async def test_wyoming_every_class(
    fault_server: LiveServer, name: str, value: str, code: str, where: str
) -> None:
    data = f'{{"text": {value}}}'.encode()
    if where == "header":
        raw = b'{"type": "synthesize", "data": ' + data + b"}\n"
    else:
        raw = b'{"type": "synthesize", "data_length": %d}\n' % len(data) + data
    events, closed = await _wyoming(fault_server, raw)
    errors = [(kind, d.get("code")) for kind, d in events if kind == "error"]
    assert errors == [("error", code)]
    assert not any(kind == "audio-start" for kind, _ in events)  # refused before any audio
    if _stream_goes_on(code):
        assert (closed, events[-1]) == (False, ("pong", {"text": "alive"}))
    else:
        assert closed


async def test_wyoming_long_voice_is_quoted_short(fault_server: LiveServer) -> None:
    header = {"type": "synthesize", "data": {"text": "Hi.", "voice": {"name": "v" * 60_000}}}
    events, closed = await _wyoming(fault_server, json.dumps(header).encode() + b"\n")
    assert not closed
    assert [(k, d.get("code")) for k, d in events] == [("error", "unknown_voice"), ("pong", None)]
    assert len(events[0][1]["text"]) < SHORT


@pytest.mark.parametrize(
    "requests",
    [
        [{"type": "synthesize", "data": {"text": "Hello there explode."}}],
        [
            {"type": "synthesize-start", "data": {}},
            {"type": "synthesize-chunk", "data": {"text": "Hello there. Now explode. "}},
        ],
    ],
    ids=["synthesize", "streamed"],
)
async def test_wyoming_engine_failure_mid_reply_still_ends_it(
    fault_server: LiveServer, requests: list[dict[str, Any]]
) -> None:
    """The engine fails after audio went out (FakeFaultyTts, on "explode"): audio-stop,
    then the error; the connection goes on. It sent audio-start, then `error`, and never
    audio-stop."""
    raw = b"".join(json.dumps(r).encode() + b"\n" for r in requests)
    events, closed = await _wyoming(fault_server, raw)
    kinds = [kind for kind, _ in events]
    assert not closed and kinds[0] == "audio-start" and "audio-chunk" in kinds
    assert kinds[-3:] == ["audio-stop", "error", "pong"], kinds
    assert events[-2][1]["code"] == "engine_error"
    assert kinds.count("audio-start") == kinds.count("audio-stop") == 1


# -- gRPC ---------------------------------------------------------------------------------


def _raw_call(channel: grpc.aio.Channel, method: str, streaming: bool) -> Any:
    """A call whose requests are sent as raw bytes (garbage included)."""
    name = f"/voxserve.v1.Voxserve/{method}"
    if streaming:
        return channel.stream_stream(
            name, request_serializer=bytes, response_deserializer=pb.ConverseResponse.FromString
        )
    return channel.unary_stream(name, request_serializer=bytes, response_deserializer=bytes)


@pytest.mark.parametrize(
    ("method", "streaming"),
    [("Converse", True), ("Recognize", True), ("Synthesize", False), ("ListVoices", False)],
)
async def test_grpc_garbage_bytes_are_invalid_argument(
    fault_server: LiveServer, method: str, streaming: bool
) -> None:
    """It was UNKNOWN "Unexpected DecodeError", without voxserve-error-code."""
    async with grpc.aio.insecure_channel(fault_server.grpc_target) as channel:
        call = _raw_call(channel, method, streaming)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            if method == "ListVoices":
                unary = channel.unary_unary(
                    "/voxserve.v1.Voxserve/ListVoices",
                    request_serializer=bytes,
                    response_deserializer=bytes,
                )
                await unary(GARBAGE, timeout=5)
            else:
                async for _ in call(iter([GARBAGE]) if streaming else GARBAGE, timeout=5):
                    pass
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error_code(caught.value) == "invalid_message"


async def test_grpc_garbage_mid_stream_is_an_in_stream_error(fault_server: LiveServer) -> None:
    """Framing is gRPC's, so one undecodable message is refused and the session goes on."""
    config = pb.ConverseRequest(config=pb.StreamConfig(mode=pb.MODE_TTS)).SerializeToString()
    mark = pb.ConverseRequest(mark=pb.Mark(id="after")).SerializeToString()
    async with grpc.aio.insecure_channel(fault_server.grpc_target) as channel:
        call = _raw_call(channel, "Converse", True)
        responses = await grpc_collect(call(iter([config, GARBAGE, mark]), timeout=10))
    assert [e.code for e in of_kind(responses, "error")] == ["invalid_message"]
    assert [m.id for m in of_kind(responses, "mark")] == ["after"]
    assert responses[-1][0] == "ended" and responses[-1][1].reason == "completed"


@pytest.mark.parametrize(
    ("rpc", "code"),
    [
        ("synthesize_voice", "unknown_voice"),
        ("converse_voice", "unknown_voice"),
        ("converse_language", "unknown_language"),
        ("recognize_language", "unknown_language"),
        ("converse_encoding", "unsupported_encoding"),
    ],
)
async def test_grpc_long_values_keep_their_code(
    fault_server: LiveServer, rpc: str, code: str
) -> None:
    """A 12-20 KB value was echoed whole into the status details (trailing metadata),
    which then overflowed: RESOURCE_EXHAUSTED, and the voxserve code lost."""
    long = "x" * 20_000
    async with grpc.aio.insecure_channel(fault_server.grpc_target) as channel:
        api = stub(channel)
        if rpc == "synthesize_voice":
            call = api.Synthesize(pb.SynthesizeRequest(text="Hi.", voice=long), timeout=5)
        elif rpc == "recognize_language":
            config = pb.RecognizeRequest(config=pb.RecognitionConfig(language=long))
            call = api.Recognize(iter([config]), timeout=5)
        else:
            field = rpc.removeprefix("converse_")
            config = pb.StreamConfig(mode=pb.MODE_ASR, **{field: long})
            call = api.Converse(iter([pb.ConverseRequest(config=config)]), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in call:
                pass
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error_code(caught.value) == code
    assert len(caught.value.details() or "") < SHORT


async def test_grpc_audio_after_end_is_counted_as_rejected(fault_server: LiveServer) -> None:
    """Each 20 ms frame of a message sent after `end` is refused and counted."""
    late = pb.ConverseRequest(audio=pb.AudioFrames(seq_id=10_000, pcm=bytes(640 * 5)))
    requests = [
        pb.ConverseRequest(config=pb.StreamConfig(mode=pb.MODE_ASR)),
        pb.ConverseRequest(audio=pb.AudioFrames(seq_id=0, pcm=bytes(640 * 5))),
        pb.ConverseRequest(end=pb.EndInput()),
        late,
    ]
    async with grpc.aio.insecure_channel(fault_server.grpc_target) as channel:
        responses = await grpc_collect(stub(channel).Converse(iter(requests), timeout=10))
    ended = responses[-1][1]
    assert (ended.received, ended.rejected) == (5, 5)
    assert [e.code for e in of_kind(responses, "error")] == ["invalid_message"]


async def test_grpc_client_that_awaits_ended_before_half_closing_gets_it(
    fault_server: LiveServer,
) -> None:
    """After `end`, the call reads on until the half-close (so late requests are counted
    and never race the status); a client that waits for `ended` first is not left hanging:
    `ended` and OK come once it has sent nothing for the linger (1 s), not at the 300 s idle
    limit."""
    async with grpc.aio.insecure_channel(fault_server.grpc_target) as channel:
        call = stub(channel).Converse(timeout=10)
        await call.write(pb.ConverseRequest(config=pb.StreamConfig(mode=pb.MODE_ASR)))
        await call.write(pb.ConverseRequest(audio=pb.AudioFrames(seq_id=0, pcm=bytes(640))))
        await call.write(pb.ConverseRequest(end=pb.EndInput()))
        kinds = []
        async with asyncio.timeout(5):
            async for response in call:
                kinds.append(response.WhichOneof("event"))
        assert kinds[-1] == "ended"
        assert await call.code() == grpc.StatusCode.OK

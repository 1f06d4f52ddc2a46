"""Bad input on every transport, with healthy streams alongside: huge text, malformed WAV
uploads, broken Wyoming framing and fields. Each is refused with its code (never a 500 or
`internal`), the connection or server goes on, resources return to baseline."""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.ping import Ping, Pong
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart

from tests.conftest import LiveServer
from tests.fakes import silence, tone
from tests.faults.harness import alongside, back_to_baseline, resources
from tests.transports.grpc_client import error_code, stub
from tests.wsclient import collect, of_type
from voxserve.audio.wav import write_wav
from voxserve.v1 import voxserve_pb2 as pb

pytestmark = pytest.mark.timeout(60)
MAX_TEXT = 4000  # limits.max_text_chars
MAX_MESSAGE = 256 * 1024  # limits.max_message_bytes


async def _ws_huge_text(live: LiveServer) -> tuple[list[dict[str, Any]], int | None]:
    async with connect(live.ws_url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "tts"}))
        assert json.loads(await ws.recv())["type"] == "session.started"
        await ws.send(json.dumps({"type": "text", "text": "word " * 1000}))  # 5,000 chars
        await ws.send(json.dumps({"type": "text", "text": "Still fine.", "flush": True}))
        await ws.send(json.dumps({"type": "mark", "id": 1}))
        events, _ = await collect(ws, until="mark")
        await ws.send(json.dumps({"type": "text", "text": "x" * (MAX_MESSAGE + 10)}))
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)
        return events, ws.close_code


async def test_huge_text_over_websocket(fault_server: LiveServer) -> None:
    baseline = await resources(fault_server)
    events, close_code = await alongside(fault_server, _ws_huge_text(fault_server))
    errors = of_type(events, "error")
    assert [(e["code"], e["fatal"]) for e in errors] == [("text_too_long", False)]
    assert of_type(events, "tts.end")[0]["audio_ms"] == 100  # the next text is spoken
    assert close_code == 1009  # a message over max_message_bytes: closed by the WS layer
    await back_to_baseline(fault_server, baseline)


async def test_huge_text_over_http(fault_server: LiveServer) -> None:
    baseline = await resources(fault_server)
    url = fault_server.http_url + "/v1/audio/speech"
    # Connection: close, so the client's own pooled socket is not counted as a server leak
    # (httpx keeps a connection whose body the server refused part-way).
    async with httpx.AsyncClient(headers={"Connection": "close"}) as http:
        too_long = await http.post(url, json={"input": "a" * (MAX_TEXT + 1)})
        too_big = await http.post(url, json={"input": "a" * (MAX_MESSAGE + 1)})
    assert (too_long.status_code, too_long.json()["error"]["code"]) == (400, "text_too_long")
    assert (too_big.status_code, too_big.json()["error"]["code"]) == (413, "message_too_large")
    await back_to_baseline(fault_server, baseline)


async def test_huge_text_over_grpc(fault_server: LiveServer) -> None:
    baseline = await resources(fault_server)
    async with grpc.aio.insecure_channel(fault_server.grpc_target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            request = pb.SynthesizeRequest(text="a" * (MAX_TEXT + 1))
            async for _ in stub(channel).Synthesize(request, timeout=5):
                pass
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error_code(caught.value) == "text_too_long"
    del caught  # the error holds the call, and the call its connection
    await back_to_baseline(fault_server, baseline)


async def test_huge_text_over_wyoming(fault_server: LiveServer) -> None:
    baseline = await resources(fault_server)
    async with AsyncTcpClient("127.0.0.1", fault_server.settings.wyoming_port) as wyoming:
        await wyoming.write_event(Synthesize(text="a" * (MAX_TEXT + 1)).event())
        assert await _wyoming_error(wyoming) == "text_too_long"
        await wyoming.write_event(SynthesizeStart().event())
        for _ in range(5):
            await wyoming.write_event(SynthesizeChunk(text="a" * 1000).event())
        assert await _wyoming_error(wyoming) == "text_too_long"
    await back_to_baseline(fault_server, baseline)


async def _wyoming_error(wyoming: AsyncTcpClient) -> str | None:
    while True:
        event = await asyncio.wait_for(wyoming.read_event(), 10)
        assert event is not None
        if Error.is_type(event.type):
            return Error.from_event(event).code


def _wav_header(**fields: int) -> bytes:
    """A 44-byte PCM WAV header whose fields can be set to lies."""
    f = {"riff": 36, "channels": 1, "rate": 16000, "bits": 16, "data": 0, "fmt_size": 16}
    f.update(fields)
    block = f["channels"] * f["bits"] // 8
    return (
        b"RIFF"
        + struct.pack("<I", f["riff"])
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", f["fmt_size"], 1, f["channels"], f["rate"], 0, block, f["bits"])
        + b"data"
        + struct.pack("<I", f["data"])
    )


GOOD = write_wav(np.concatenate([silence(0.2), tone(500, 0.6), silence(0.3)]), 16_000)
MALFORMED = {
    "empty": b"",
    "not_riff": b"ID3\x04" + bytes(100),
    "riff_only": b"RIFF",
    "header_only": _wav_header(),
    "data_size_past_end": _wav_header(data=1 << 30) + bytes(64),
    "riff_size_half_sample": _wav_header(riff=37, data=1) + b"\x01",
    "eight_bit": _wav_header(bits=8, data=4) + bytes(4),
    "zero_channels": _wav_header(channels=0, data=4) + bytes(4),
    "rate_zero": _wav_header(rate=0, data=4) + bytes(4),
    "fmt_size_huge": _wav_header(fmt_size=1 << 31) + bytes(8),
    "truncated_good": GOOD[: len(GOOD) // 3 + 1],
    "random": bytes(np.random.default_rng(7).integers(0, 256, 3000, dtype=np.uint8)),
}


def test_malformed_wav_uploads_are_refused_with_a_code(fault_server: LiveServer) -> None:
    url = fault_server.http_url + "/v1/audio/transcriptions"
    outcomes: dict[str, tuple[int, str]] = {}
    for name, data in MALFORMED.items():
        response = httpx.post(url, files={"file": ("a.wav", data)}, data={"model": "whisper-1"})
        body = response.json() if response.status_code != 200 else {}
        outcomes[name] = (response.status_code, body.get("error", {}).get("code", "ok"))
    # Anything but a 5xx: a readable refusal (or, for a truncated but readable file, text).
    assert all(status < 500 for status, _ in outcomes.values()), outcomes
    refused = {name: code for name, (status, code) in outcomes.items() if status == 400}
    assert set(refused.values()) <= {"invalid_audio", "unsupported_encoding", "empty_audio"}
    assert len(refused) >= len(MALFORMED) - 1, outcomes
    good = httpx.post(url, files={"file": ("a.wav", GOOD)}, data={"model": "whisper-1"})
    assert good.json() == {"text": "tone500"}


async def _raw_wyoming(live: LiveServer, data: bytes) -> tuple[list[str | None], bool]:
    """Send raw bytes; the error codes the server answers and whether it then closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", live.settings.wyoming_port)
    writer.write(data)
    await writer.drain()
    codes: list[str | None] = []
    closed = False
    try:
        while True:
            line = await asyncio.wait_for(reader.readline(), 2)
            if not line:
                closed = True
                break
            header = json.loads(line)
            extra = await reader.readexactly(header.get("data_length") or 0)
            data_dict = {**(header.get("data") or {}), **(json.loads(extra) if extra else {})}
            codes.append(data_dict.get("code"))
    except TimeoutError:
        pass
    finally:
        writer.close()
    return codes, closed


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"not json\n", "invalid_json"),
        (b"[]\n", "invalid_message"),
        (b'{"data": {}}\n', "invalid_message"),
        (b'{"type": "audio-chunk", "data_length": "5"}\n', "invalid_message"),
        (b'{"type": "audio-chunk", "payload_length": 1073741824}\n', "message_too_large"),
        (b"{" * 70_000 + b"\n", "message_too_large"),  # past the reader's 64 KiB line limit
    ],
    ids=["not_json", "array", "no_type", "length_string", "payload_1gib", "endless_line"],
)
async def test_broken_wyoming_framing_ends_only_that_connection(
    fault_server: LiveServer, raw: bytes, code: str
) -> None:
    baseline = await resources(fault_server)
    codes, closed = await alongside(fault_server, _raw_wyoming(fault_server, raw))
    assert (codes, closed) == ([code], True)
    await back_to_baseline(fault_server, baseline)


async def test_bad_wyoming_fields_are_errors_and_the_connection_goes_on(
    fault_server: LiveServer,
) -> None:
    async with AsyncTcpClient("127.0.0.1", fault_server.settings.wyoming_port) as wyoming:
        bad = AudioChunk(rate=16000, width=2, channels=1, audio=b"\0\0").event()
        bad.data["rate"] = "16000"
        await wyoming.write_event(bad)
        assert await _wyoming_error(wyoming) == "invalid_message"
        voice = Synthesize(text="Hi.").event()
        voice.data["voice"] = "joe"
        await wyoming.write_event(voice)
        assert await _wyoming_error(wyoming) == "invalid_message"
        await wyoming.write_event(Ping(text="alive").event())
        pong = await asyncio.wait_for(wyoming.read_event(), 5)
        assert pong is not None and Pong.from_event(pong).text == "alive"
    assert fault_server.runtime.active_sessions == 0

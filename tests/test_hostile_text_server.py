"""Hostile text and memory pressure end to end: the real server with the real engines, real
clients on real sockets (HTTP, WebSocket, gRPC, Wyoming).

- The 3.5 KB request of digits and commas that once grew a server by 300 MB/s until the
  kernel killed it: answered 200 with audio at once, the process grows by tens of MB, and
  the synthesis stops when the client goes.
- Text with nothing to say is `empty_text` on every transport.
- Over the memory guard's threshold new work is refused `overloaded` on every transport
  and counted in the metrics; under it, work is served again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import grpc
import httpx
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import Synthesize

from tests.conftest import LiveServer
from tests.helpers import eventually
from tests.hostile_text import DIGITS_REQUEST
from tests.rss import MB, RssPeak
from tests.transports.grpc_client import collect, error_code, stub
from tests.wsclient import collect as collect_ws
from tests.wsclient import of_type, start
from voxserve.v1 import voxserve_pb2 as pb

pytestmark = pytest.mark.timeout(120)

# "^" passes the speakable test (a symbol) but piper makes no audio for it.
NOTHING_TO_SAY = ["....", "\u200b\u200d\ufeff", "\x00\x01\x1b", " ?! … ", "^"]


@pytest.fixture(scope="module")
def http(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.http_url, timeout=60) as client:
        yield client


def test_the_digits_request_is_answered_with_bounded_memory_and_stops_with_its_client(
    live_server: LiveServer, http: httpx.Client
) -> None:
    runtime = live_server.runtime
    stage = runtime.stages.stage("tts")
    body = {"input": DIGITS_REQUEST, "voice": "joe", "response_format": "pcm"}
    started = time.monotonic()
    with RssPeak() as peak:
        with http.stream("POST", "/v1/audio/speech", json=body) as response:
            assert response.status_code == 200, response.read()
            first_s = time.monotonic() - started
            got = 0
            for part in response.iter_bytes():
                got += len(part)
                if got >= 24_000 * 2 * 8:  # 8 s of audio: a few model calls
                    break
        # The client is gone: the flight is abandoned and the engine stops after its piece.
        assert runtime.cache is not None
        deadline = time.monotonic() + 10
        while runtime.cache.stats().in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runtime.cache.stats().in_flight == 0
        calls = stage.calls
        time.sleep(1.5)  # several pieces' time
        assert stage.calls == calls and stage.running == 0
    assert first_s < 10
    assert peak.growth < 300 * MB, f"grew {peak.growth / MB:.0f} MB"


async def test_a_websocket_reply_of_digits_is_bounded_and_cancel_stops_it(
    live_server: LiveServer,
) -> None:
    """840 characters of numbers once cost a server 2.9 GB over the WebSocket."""
    runtime = live_server.runtime
    stage = runtime.stages.stage("tts")
    with RssPeak() as peak:
        async with connect(live_server.ws_url) as ws:
            assert (await start(ws, mode="tts", voice="joe"))["type"] == "session.started"
            text = {"type": "text", "text": DIGITS_REQUEST[:840], "flush": True}
            await ws.send(json.dumps(text))
            audio = 0
            async with asyncio.timeout(30):
                while audio < 3:
                    audio += isinstance(await ws.recv(), bytes)
            await ws.send(json.dumps({"type": "cancel"}))
            await ws.send(json.dumps({"type": "session.end"}))
            events, _ = await collect_ws(ws, limit_s=30)
        assert runtime.cache is not None
        await eventually(lambda: runtime.cache is not None and not runtime.cache.stats().in_flight)
        calls = stage.calls
        await asyncio.sleep(1.5)  # several pieces' time
        assert stage.calls == calls
    ends = of_type(events, "tts.end")
    assert len(ends) == 1 and ends[0]["interrupted"]
    assert events[-1]["type"] == "session.ended"
    assert peak.growth < 300 * MB, f"grew {peak.growth / MB:.0f} MB"


@pytest.mark.parametrize("text", NOTHING_TO_SAY)
def test_http_nothing_to_say_is_empty_text(http: httpx.Client, text: str) -> None:
    response = http.post("/v1/audio/speech", json={"input": text, "voice": "joe"})
    assert response.status_code == 400, response.content[:100]
    assert response.json()["error"]["code"] == "empty_text"


async def test_websocket_nothing_to_say_is_empty_text(live_server: LiveServer) -> None:
    async with connect(live_server.ws_url) as ws:
        started = await start(ws, mode="tts", voice="joe")
        assert started["type"] == "session.started"
        for text in NOTHING_TO_SAY:
            await ws.send(json.dumps({"type": "text", "text": text, "flush": True}))
        # Streamed: "..." between sentences is skipped, not refused.
        await ws.send(json.dumps({"type": "text", "text": "Hi there. .... ", "flush": False}))
        await ws.send(json.dumps({"type": "text", "text": "\u200b Bye now.", "flush": True}))
        await ws.send(json.dumps({"type": "session.end"}))
        events, _ = await collect_ws(ws, limit_s=60)
    errors = [(e["code"], e["fatal"], e["reply"]) for e in events if e["type"] == "error"]
    assert errors == [("empty_text", False, reply) for reply in range(len(NOTHING_TO_SAY))]
    spoken = of_type(events, "tts.end")
    assert len(spoken) == 1 and spoken[0]["reply"] == len(NOTHING_TO_SAY)
    assert spoken[0]["audio_ms"] > 500 and not spoken[0]["interrupted"]
    assert events[-1]["type"] == "session.ended" and events[-1]["reason"] == "completed"


async def test_grpc_nothing_to_say_is_empty_text(live_server: LiveServer) -> None:
    async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:
        for text in NOTHING_TO_SAY:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(stub(channel).Synthesize(pb.SynthesizeRequest(text=text)))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, text
            assert error_code(caught.value) == "empty_text"


async def wyoming_error(live: LiveServer, text: str) -> str:
    async with AsyncTcpClient("127.0.0.1", live.settings.wyoming_port) as wyoming:
        await wyoming.write_event(Synthesize(text=text).event())
        async with asyncio.timeout(30):
            event = await wyoming.read_event()
    assert event is not None and Error.is_type(event.type), event
    return str(Error.from_event(event).code)


async def test_wyoming_nothing_to_say_is_empty_text(live_server: LiveServer) -> None:
    for text in NOTHING_TO_SAY:
        assert await wyoming_error(live_server, text) == "empty_text", text


def guard_metrics(live: LiveServer) -> dict[str, float]:
    text = httpx.get(f"{live.http_url}/metrics", timeout=10).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("voxserve_memory_guard_"):
                found[sample.name + str(sample.labels.get("what", ""))] = sample.value
    return found


async def test_over_the_memory_threshold_new_work_is_refused_on_every_transport(
    live_server: LiveServer,
) -> None:
    guard = live_server.runtime.memory_guard
    before = guard_metrics(live_server)
    assert before["voxserve_memory_guard_threshold_bytes"] == guard.threshold > 0
    saved = guard.threshold
    guard.threshold = 1  # below any RSS: as if the process were at its limit
    try:
        async with httpx.AsyncClient(base_url=live_server.http_url, timeout=30) as client:
            response = await client.post("/v1/audio/speech", json={"input": "Hello there."})
        assert response.status_code == 503 and response.headers["retry-after"] == "2"
        assert response.json()["error"]["code"] == "overloaded"
        assert "memory" in response.json()["error"]["message"]

        async with connect(live_server.ws_url) as ws:
            event = json.loads(await asyncio.wait_for(ws.recv(), 5))
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
        assert event["code"] == "overloaded" and ws.close_code == 1013

        async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(stub(channel).Synthesize(pb.SynthesizeRequest(text="Hello.")))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_code(caught.value) == "overloaded"

        assert await wyoming_error(live_server, "Hello there.") == "overloaded"

        after = guard_metrics(live_server)
        assert after["voxserve_memory_guard_threshold_bytes"] == 1
        grown = {
            what: after[f"voxserve_memory_guard_refusals_total{what}"]
            - before[f"voxserve_memory_guard_refusals_total{what}"]
            for what in ("request", "session")
        }
        assert grown == {"request": 2, "session": 2}  # HTTP + gRPC; WebSocket + Wyoming
    finally:
        guard.threshold = saved
    await eventually(lambda: live_server.runtime.active_sessions == 0)
    async with httpx.AsyncClient(base_url=live_server.http_url, timeout=60) as client:
        body = {"input": "Hello there.", "response_format": "wav"}
        response = await client.post("/v1/audio/speech", json=body)
    assert response.status_code == 200 and len(response.content) > 10_000

"""Every door's engine calls reach the stage metrics: one request through each door's real
client (the `openai` SDK, a grpc stub, the `wyoming` package, websockets, an aiortc call),
then /metrics shows that stage's latency and queue wait moved, under the request's work
class (live: a session; bulk: one-shot speech and uploads). Fake engines: these tests are
about where calls are observed, not about speech."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import openai
import pytest
from websockets.asyncio.client import connect
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeAsr, fake_runtime, silence, tone
from tests.helpers import realtime_connection
from tests.observe.test_metrics_live import scrape, value
from tests.transports.grpc_client import collect as grpc_collect
from tests.transports.grpc_client import stub
from tests.wsclient import collect, send_audio, start
from voxserve.audio.resample import resample
from voxserve.audio.wav import write_wav
from voxserve.bench.webrtc_client import WebRtcCaller, clip_source, to_48k
from voxserve.config import load_settings
from voxserve.v1 import voxserve_pb2 as pb

LATENCY = "voxserve_stage_latency_seconds_count"
WAIT = "voxserve_stage_queue_wait_seconds_count"
TRANSCRIBED = "conversation.item.input_audio_transcription.completed"
LISTEN_ONLY: dict[str, Any] = {
    "type": "realtime",
    "audio": {"input": {"turn_detection": {"type": "server_vad", "create_response": False}}},
}


class FakeTranslatingAsr(FakeAsr):
    """The fake ASR, declaring translation (it answers the same words either way)."""

    tasks = ("transcribe", "translate")


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    settings = load_settings(port=free_port(), log_level="warning")
    runtime = fake_runtime(settings, asr=FakeTranslatingAsr(delay_s=0.01))
    live = start_server(settings, runtime, grpc_port=free_port(), wyoming_port=free_port())
    yield live
    stop_server(live)


def utterance(rate: int = 16_000) -> np.ndarray:
    pcm = np.concatenate([silence(0.3), tone(440, 1.0), silence(1.0)])
    return pcm if rate == 16_000 else resample(pcm, 16_000, rate)


def moved(live: LiveServer, stages: str, work_class: str, request: Any) -> None:
    """Run `request()` (sync) and check both histograms of each of `stages` (comma-separated)
    counted its calls under `work_class`."""
    before = scrape(live)
    request()
    after = scrape(live)
    for stage in stages.split(","):
        labels = {"stage": stage, "work_class": work_class}
        for name in (LATENCY, WAIT):
            assert value(after, name, **labels) > value(before, name, **labels), (name, labels)


def sdk(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.http_url}/v1", api_key="x", max_retries=0, timeout=30)


def test_http_speech(server: LiveServer) -> None:
    def speak() -> None:
        with sdk(server) as client:
            reply = client.audio.speech.create(
                model="tts-1", voice="alloy", input="One-shot speech is measured too."
            )
        assert reply.content

    moved(server, "tts", "bulk", speak)
    first = "voxserve_tts_first_audio_seconds_count"
    assert value(scrape(server), first, source="miss", work_class="bulk") >= 1


def wav_upload() -> tuple[str, bytes, str]:
    return ("tone.wav", write_wav(utterance(), 16_000), "audio/wav")


def test_http_transcriptions(server: LiveServer) -> None:
    def transcribe() -> None:
        with sdk(server) as client:
            result = client.audio.transcriptions.create(model="whisper-1", file=wav_upload())
        assert result.text

    moved(server, "asr", "bulk", transcribe)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK marks translations so
def test_http_translations(server: LiveServer) -> None:
    def translate() -> None:
        with sdk(server) as client:
            result = client.audio.translations.create(model="whisper-1", file=wav_upload())
        assert result.text

    moved(server, "asr", "bulk", translate)


def test_grpc_synthesize(server: LiveServer) -> None:
    async def synthesize() -> None:
        async with grpc.aio.insecure_channel(server.grpc_target) as channel:
            request = pb.SynthesizeRequest(text="Speech over gRPC is measured.")
            responses = await grpc_collect(stub(channel).Synthesize(request))
        assert responses

    moved(server, "tts", "bulk", lambda: asyncio.run(synthesize()))


def test_wyoming_synthesize(server: LiveServer) -> None:
    async def synthesize() -> None:
        port = server.settings.wyoming_port
        async with AsyncTcpClient("127.0.0.1", port, read_timeout=30) as client:
            await client.write_event(Synthesize(text="Speech over Wyoming is measured.").event())
            while True:
                event = await client.read_event()
                assert event is not None
                if event.type == "audio-stop":
                    return

    moved(server, "tts", "bulk", lambda: asyncio.run(synthesize()))


def test_live_stream(server: LiveServer) -> None:
    async def stream() -> None:
        async with connect(server.ws_url) as ws:
            await start(ws, mode="asr")
            await send_audio(ws, utterance(), speedup=4.0)
            await ws.send(json.dumps({"type": "audio.end"}))
            events, _ = await collect(ws)
        assert any(e["type"] == "transcript.final" for e in events)

    moved(server, "vad,asr", "live", lambda: asyncio.run(stream()))


def test_realtime(server: LiveServer) -> None:
    async def session() -> None:
        pcm = utterance(24_000).astype("<i2").tobytes()
        async with realtime_connection(
            server, "x", model="gpt-realtime", extra_query={"intent": "transcription"}
        ) as conn:
            for i in range(0, len(pcm), 4800):  # 100 ms at 24 kHz, at 4x real time
                chunk = base64.b64encode(pcm[i : i + 4800]).decode()
                await conn.input_audio_buffer.append(audio=chunk)
                await asyncio.sleep(0.025)
            async with asyncio.timeout(30):
                while json.loads(await conn.recv_bytes())["type"] != TRANSCRIBED:
                    pass

    moved(server, "vad,asr", "live", lambda: asyncio.run(session()))


def test_webrtc_call(server: LiveServer) -> None:
    async def call() -> None:
        caller = WebRtcCaller(clip_source(to_48k(utterance(), 16_000)))
        try:
            await caller.call(server.http_url, None, session=LISTEN_ONLY)
            await caller.wait_for(TRANSCRIBED, timeout_s=30)
            await caller.hang_up()
        finally:
            await caller.close()

    moved(server, "vad,asr", "live", lambda: asyncio.run(call()))

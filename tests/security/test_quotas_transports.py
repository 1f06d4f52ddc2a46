"""Per-key quotas over real sockets: each transport's refusal signal (WebSocket error +
close 1013, HTTP 429 + Retry-After, gRPC RESOURCE_EXHAUSTED, Wyoming `error`), audio over
quota mid-session counted in `rejected` while accepted audio is still finished, other keys
unaffected, the metric. Fake engines: this is about the doors, not the models."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from pydantic import SecretStr
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from wyoming.asr import Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.ping import Ping, Pong

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import fake_runtime, silence, tone
from tests.transports.grpc_client import audio_requests, collect, error_code, of_kind, stub
from tests.wsclient import collect as ws_collect
from tests.wsclient import frame_message, of_type
from voxserve.audio.wav import write_wav
from voxserve.config import QuotaLimits, QuotasConfig, Settings, load_settings
from voxserve.server.session.auth import digest, key_id
from voxserve.server.session.quotas import quotas_of
from voxserve.v1 import voxserve_pb2 as pb

SESSION_KEY = "quota-sessions-key"  # default limits: one session at a time
OTHER_KEY = "quota-other-key"
RATE_KEY = "quota-rate-key"  # 1 request/s, burst 2
AUDIO_KEY = "quota-audio-key"  # 1 s of audio per minute (WebSocket)
AUDIO_GRPC_KEY = "quota-audio-grpc-key"  # the same, for gRPC
AUDIO_HTTP_KEY = "quota-audio-http-key"  # the same, for uploads
KEYS = [SESSION_KEY, OTHER_KEY, RATE_KEY, AUDIO_KEY, AUDIO_GRPC_KEY, AUDIO_HTTP_KEY]
ONE_S_OF_AUDIO = QuotaLimits(audio_s_per_min=1.0)


def kid(key: str) -> str:
    return key_id(digest(key))


def quota_settings(**update: Any) -> Settings:
    settings = load_settings(port=free_port(), log_level="warning")
    return settings.model_copy(update=update)


@pytest.fixture(scope="module")
def quota_server() -> Iterator[LiveServer]:
    quotas = QuotasConfig(
        default=QuotaLimits(max_sessions=1, requests_per_s=1000, burst=1000, audio_s_per_min=600),
        keys={
            kid(RATE_KEY): QuotaLimits(requests_per_s=1, burst=2),
            kid(AUDIO_KEY): ONE_S_OF_AUDIO,
            kid(AUDIO_GRPC_KEY): ONE_S_OF_AUDIO,
            kid(AUDIO_HTTP_KEY): ONE_S_OF_AUDIO,
        },
    )
    settings = quota_settings(api_keys=[SecretStr(k) for k in KEYS], quotas=quotas)
    live = start_server(settings, fake_runtime(settings), grpc_port=free_port())
    yield live
    stop_server(live)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def refusals(live: LiveServer, kind: str) -> float:
    text = httpx.get(live.http_url + "/metrics").text
    for line in text.splitlines():
        if line.startswith(f'voxserve_quota_refusals_total{{kind="{kind}"}}'):
            return float(line.split()[-1])
    return 0.0


async def _refusal(ws_url: str, key: str) -> tuple[dict[str, Any], int]:
    """Refused in answer to session.start (a `session.resume` would need no new slot)."""
    async with connect(ws_url, additional_headers=bearer(key)) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "tts"}))
        event = json.loads(await ws.recv())
        with pytest.raises(ConnectionClosed):
            await ws.recv()
        assert ws.close_code is not None
        return event, ws.close_code


async def test_ws_second_session_of_a_key_is_refused_at_open(quota_server: LiveServer) -> None:
    before = refusals(quota_server, "sessions")
    url = quota_server.ws_url
    async with connect(url, additional_headers=bearer(SESSION_KEY)) as first:
        await first.send(json.dumps({"type": "session.start", "mode": "tts"}))
        assert json.loads(await first.recv())["type"] == "session.started"
        event, code = await _refusal(url, SESSION_KEY)
        assert (event["code"], event["fatal"], event["retry_after_ms"]) == (
            "quota_exceeded",
            True,
            1000,
        )
        assert code == 1013
        # Another key is not affected by this key's limit.
        async with connect(url, additional_headers=bearer(OTHER_KEY)) as other:
            await other.send(json.dumps({"type": "session.start", "mode": "tts"}))
            assert json.loads(await other.recv())["type"] == "session.started"
    # The slot comes back when the session ends.
    for _ in range(50):
        if quota_server.runtime.active_sessions == 0:
            break
        await asyncio.sleep(0.02)
    async with connect(url, additional_headers=bearer(SESSION_KEY)) as again:
        await again.send(json.dumps({"type": "session.start", "mode": "tts"}))
        assert json.loads(await again.recv())["type"] == "session.started"
    assert refusals(quota_server, "sessions") == before + 1


def test_http_over_the_request_rate_is_429_with_retry_after(quota_server: LiveServer) -> None:
    url = quota_server.http_url + "/v1/voices"
    statuses = [httpx.get(url, headers=bearer(RATE_KEY)) for _ in range(3)]
    assert [r.status_code for r in statuses] == [200, 200, 429]
    refused = statuses[-1]
    assert refused.json()["error"]["code"] == "quota_exceeded"
    assert refused.headers["retry-after"] == "1"
    # Other keys keep their own rate.
    assert httpx.get(url, headers=bearer(OTHER_KEY)).status_code == 200


def test_http_upload_over_the_audio_minute_is_429(quota_server: LiveServer) -> None:
    wav = write_wav(np.concatenate([tone(500, 1.5), silence(0.5)]), 16_000)
    response = httpx.post(
        quota_server.http_url + "/v1/audio/transcriptions",
        files={"file": ("a.wav", wav, "audio/wav")},
        data={"model": "whisper-1"},
        headers=bearer(AUDIO_HTTP_KEY),
    )
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "quota_exceeded"
    assert int(response.headers["retry-after"]) >= 1


async def test_ws_audio_over_quota_is_refused_counted_and_the_rest_finished(
    quota_server: LiveServer,
) -> None:
    before = refusals(quota_server, "audio")
    accepted = np.concatenate([tone(500, 0.6), silence(0.4)])  # 1.0 s: exactly the minute
    over = tone(900, 0.5)  # 25 frames over quota
    async with connect(quota_server.ws_url, additional_headers=bearer(AUDIO_KEY)) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "asr", "partials": False}))
        assert json.loads(await ws.recv())["type"] == "session.started"
        seq = 0
        for samples in (accepted, over):
            for i in range(0, samples.size, 320):
                await ws.send(frame_message(seq, samples[i : i + 320]))
                seq += 1
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await ws_collect(ws)
    errors = of_type(events, "error")
    assert len(errors) == 1  # one event for the run of refused frames, not 25
    assert errors[0]["code"] == "quota_exceeded" and errors[0]["fatal"] is False
    assert errors[0]["retry_after_ms"] >= 1000
    ended = of_type(events, "session.ended")[0]
    assert ended["received"] + ended["rejected"] == seq == 75
    assert (ended["received"], ended["rejected"]) == (50, 25)
    assert ended["processed"] == ended["accepted"] == 50  # nothing accepted was lost
    assert [f["text"] for f in of_type(events, "transcript.final")] == ["tone500"]
    assert refusals(quota_server, "audio") == before + 1


async def test_grpc_quota_refusals_are_resource_exhausted(quota_server: LiveServer) -> None:
    async with grpc.aio.insecure_channel(quota_server.grpc_target) as channel:
        rate = (("authorization", f"Bearer {RATE_KEY}"),)
        await asyncio.sleep(2.1)  # RATE_KEY's bucket refills from the HTTP test
        for _ in range(2):
            await stub(channel).ListVoices(pb.ListVoicesRequest(), metadata=rate, timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub(channel).ListVoices(pb.ListVoicesRequest(), metadata=rate, timeout=5)
        assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_code(caught.value) == "quota_exceeded"

        held = (("authorization", f"Bearer {SESSION_KEY}"),)
        config = pb.RecognitionConfig(sample_rate=16000)

        async def held_open() -> Any:
            yield pb.RecognizeRequest(config=config)
            await asyncio.sleep(5)

        first = stub(channel).Recognize(held_open(), metadata=held, timeout=10)
        assert (await first.read()).WhichOneof("event") == "started"
        # Only the config: a client still writing when the call is refused may see grpc's
        # own INTERNAL instead of the status (a client-side race, not the server's answer).
        second = stub(channel).Recognize(held_open(), metadata=held, timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await collect(second)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_code(refused.value) == "quota_exceeded"
        first.cancel()


async def test_grpc_audio_over_quota_is_an_in_stream_error_and_counted(
    quota_server: LiveServer,
) -> None:
    samples = np.concatenate([tone(600, 0.6), silence(0.4), tone(900, 0.5)])
    config = pb.RecognitionConfig(sample_rate=16000, partials=False)
    metadata = (("authorization", f"Bearer {AUDIO_GRPC_KEY}"),)
    async with grpc.aio.insecure_channel(quota_server.grpc_target) as channel:
        requests = audio_requests(pb.RecognizeRequest, config, samples, speedup=50.0)
        responses = await collect(stub(channel).Recognize(requests, metadata=metadata))
    errors = of_kind(responses, "error")
    assert [e.code for e in errors] == ["quota_exceeded"]
    ended = of_kind(responses, "ended")[0]
    assert (ended.received, ended.rejected) == (50, 25)
    assert ended.processed == ended.accepted == 50
    finals = [t.text for t in of_kind(responses, "transcript") if t.is_final]
    assert finals == ["tone600"]


@pytest.fixture(scope="module")
def anonymous_server() -> Iterator[LiveServer]:
    """Auth off, `quotas.anonymous` on: the one anonymous principal is limited."""
    quotas = QuotasConfig(anonymous=True, default=QuotaLimits(max_sessions=1, audio_s_per_min=1.0))
    settings = quota_settings(quotas=quotas)
    live = start_server(settings, fake_runtime(settings), wyoming_port=free_port())
    yield live
    stop_server(live)


async def test_anonymous_quota_applies_when_configured_on_ws_and_wyoming(
    anonymous_server: LiveServer,
) -> None:
    live = anonymous_server
    async with connect(live.ws_url) as first:
        await first.send(json.dumps({"type": "session.start", "mode": "tts"}))
        assert json.loads(await first.recv())["type"] == "session.started"
        event, code = await _refusal(live.ws_url, "ignored-no-auth")
        assert (event["code"], code) == ("quota_exceeded", 1013)
        wyoming = AsyncTcpClient("127.0.0.1", live.settings.wyoming_port)
        async with wyoming:
            await wyoming.write_event(AudioStart(rate=16000, width=2, channels=1).event())
            reply = await wyoming.read_event()
            assert reply is not None and Error.from_event(reply).code == "quota_exceeded"
    quotas = quotas_of(live.runtime)
    for _ in range(100):  # the WebSocket session gives its slot back as it closes
        if quotas.sessions("anonymous") == 0:
            break
        await asyncio.sleep(0.02)
    async with AsyncTcpClient("127.0.0.1", live.settings.wyoming_port) as wyoming:
        pcm = np.concatenate([tone(500, 0.6), silence(0.3)]).astype("<i2").tobytes()
        await wyoming.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        await wyoming.write_event(AudioChunk(rate=16000, width=2, channels=1, audio=pcm).event())
        await wyoming.write_event(AudioStop().event())
        while (reply := await wyoming.read_event()) is not None and reply.type != "transcript":
            assert reply.type in ("transcript-start", "transcript-chunk"), reply
        assert reply is not None and Transcript.from_event(reply).text == "tone500"
        assert (await wyoming.read_event()).type == "transcript-stop"  # type: ignore[union-attr]
        # 0.9 s of the minute is spent: the next 0.5 s is refused, the request ended (its
        # error, then an empty transcript).
        more = tone(500, 0.5).astype("<i2").tobytes()
        await wyoming.write_event(AudioChunk(rate=16000, width=2, channels=1, audio=more).event())
        reply = await wyoming.read_event()
        assert reply is not None and Error.from_event(reply).code == "quota_exceeded"
        reply = await wyoming.read_event()
        assert reply is not None and Transcript.from_event(reply).text == ""
        await wyoming.write_event(Ping(text="still").event())  # the connection stays usable
        pong = await wyoming.read_event()
        assert pong is not None and Pong.from_event(pong).text == "still"
    assert live.runtime.active_sessions == 0

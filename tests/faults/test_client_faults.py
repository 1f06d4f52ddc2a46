"""Clients that misbehave, each with healthy streams alongside: disconnects mid-utterance
(close frame, TCP abort, gRPC cancel, while a final is stuck in a hung engine), duplicated /
reordered / dropped / truncated frames, floods of tiny messages. The faulty stream gets a
clear error or recovers, the healthy ones finish with the right words, counters add up,
resources return to baseline."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.conftest import LiveServer
from tests.fakes import silence, tone, word_for
from tests.faults.fakes import HANG_HZ, HANG_S
from tests.faults.harness import (
    alongside,
    back_to_baseline,
    counters_add_up,
    finals,
    message_stream,
    resources,
    utterances,
)
from tests.transports.grpc_client import FRAME, audio_requests, stub
from tests.wsclient import collect, frame_message, frame_messages, of_type, send_audio
from voxserve.v1 import voxserve_pb2 as pb

pytestmark = pytest.mark.timeout(60)
Message = bytes | str


async def _open_asr(ws: ClientConnection) -> None:
    await ws.send(json.dumps({"type": "session.start", "mode": "asr", "partials": False}))
    assert json.loads(await ws.recv())["type"] == "session.started"


async def _disconnect_mid_utterance(live: LiveServer, how: str) -> None:
    async with connect(live.ws_url) as ws:
        await _open_asr(ws)
        await send_audio(ws, np.concatenate([silence(0.2), tone(800, 0.5)]), speedup=5)
        await asyncio.sleep(0.1)
        if how == "abort":
            ws.transport.abort()  # no close frame: the TCP connection just goes
        else:
            await ws.close()


@pytest.mark.parametrize("how", ["close", "abort"])
async def test_ws_disconnect_mid_utterance(fault_server: LiveServer, how: str) -> None:
    baseline = await resources(fault_server)
    await alongside(fault_server, _disconnect_mid_utterance(fault_server, how))
    await back_to_baseline(fault_server, baseline)


async def test_disconnect_while_the_final_is_in_a_hung_engine(fault_server: LiveServer) -> None:
    """The stage call is abandoned; its slot comes back when the engine returns."""
    baseline = await resources(fault_server)

    async def leave_during_final() -> None:
        async with connect(fault_server.ws_url) as ws:
            await _open_asr(ws)
            await send_audio(ws, utterances(HANG_HZ), speedup=5)
            while json.loads(await ws.recv())["type"] != "vad.end":
                pass
        # Gone while the engine sleeps in the final's transcription.

    await alongside(fault_server, leave_during_final())
    await asyncio.sleep(HANG_S)
    await back_to_baseline(fault_server, baseline)
    assert fault_server.runtime.stages.stage("asr").running == 0


async def test_grpc_cancel_mid_utterance(fault_server: LiveServer) -> None:
    baseline = await resources(fault_server)

    async def cancel() -> None:
        async with grpc.aio.insecure_channel(fault_server.grpc_target) as channel:
            samples = np.concatenate([silence(0.2), tone(800, 3.0)])
            config = pb.RecognitionConfig(sample_rate=16000)
            call = stub(channel).Recognize(audio_requests(pb.RecognizeRequest, config, samples))
            assert (await call.read()).WhichOneof("event") == "started"
            await asyncio.sleep(0.3)
            call.cancel()

    await alongside(fault_server, cancel())
    await back_to_baseline(fault_server, baseline)


def duplicated(frames: list[bytes]) -> list[bytes]:
    return [f for frame in frames for f in (frame, frame)]


def reordered(frames: list[bytes]) -> list[bytes]:
    out = list(frames)
    for i in range(0, len(out) - 1, 2):
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


def dropped(frames: list[bytes]) -> list[bytes]:
    return [frame for i, frame in enumerate(frames) if i % 7 != 3]


def truncated(frames: list[bytes]) -> list[bytes]:
    """Every 10th message cut: to 3 bytes (shorter than its seq_id) or to an odd length."""
    out = list(frames)
    for i in range(5, len(out), 10):
        out[i] = out[i][:3] if i % 20 == 5 else out[i][:-1]
    return out


FRAMES = 160  # utterances(500, 900): 3.2 s
CASES: dict[str, tuple[Callable[[list[bytes]], list[bytes]], dict[str, int]]] = {
    "duplicated": (duplicated, {"duplicates": FRAMES, "rejected": 0}),
    "reordered": (reordered, {"reordered": FRAMES // 2, "gaps": 0, "rejected": 0}),
    "dropped": (dropped, {"gaps": len(range(3, FRAMES, 7)), "rejected": 0}),
    "truncated": (truncated, {"rejected": len(range(5, FRAMES, 10))}),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_damaged_frame_streams(fault_server: LiveServer, case: str) -> None:
    mutate, expected = CASES[case]
    frames = frame_messages(utterances(500, 900))
    assert len(frames) == FRAMES
    messages = mutate(frames)
    baseline = await resources(fault_server)
    events = await alongside(fault_server, message_stream(fault_server, messages))
    assert finals(events) == [word_for(500), word_for(900)]  # recovered: the words survive
    ended = of_type(events, "session.ended")[0]
    counters_add_up(ended, sent=len(messages))
    assert {name: ended[name] for name in expected} == expected
    errors = of_type(events, "error")
    assert len(errors) == expected["rejected"] and not any(e["fatal"] for e in errors)
    assert {e["code"] for e in errors} <= {"frame_too_short", "odd_length_pcm"}
    await back_to_baseline(fault_server, baseline)


async def _flood(live: LiveServer, messages: list[Message], *, mode: str) -> list[dict[str, Any]]:
    async with connect(live.ws_url, max_queue=None) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": mode, "partials": False}))
        assert json.loads(await ws.recv())["type"] == "session.started"
        for message in messages:
            await ws.send(message)
        await ws.send(json.dumps({"type": "mark", "id": "last"}))
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws, limit_s=40)
    return events


async def test_flood_of_one_sample_frames(fault_server: LiveServer) -> None:
    messages: list[Message] = [frame_message(seq, np.zeros(1, np.int16)) for seq in range(5000)]
    baseline = await resources(fault_server)
    events = await alongside(fault_server, _flood(fault_server, messages, mode="asr"))
    ended = of_type(events, "session.ended")[0]
    counters_add_up(ended, sent=5000)
    assert ended["processed"] == 5000
    await back_to_baseline(fault_server, baseline)


async def test_flood_of_marks_and_bad_json(fault_server: LiveServer) -> None:
    """3,000 marks, each echoed in order, and 2,000 unparsable messages, each one
    non-fatal error; the session still ends normally."""
    marks: list[Message] = [json.dumps({"type": "mark", "id": i}) for i in range(3000)]
    junk: list[Message] = ["{"] * 2000
    messages = [m for pair in zip(marks, junk, strict=False) for m in pair] + marks[2000:]
    baseline = await resources(fault_server)
    events = await alongside(fault_server, _flood(fault_server, messages, mode="tts"))
    echoed = [e["id"] for e in of_type(events, "mark")]
    assert echoed == [*range(3000), "last"]
    errors = of_type(events, "error")
    assert len(errors) == 2000 and {e["code"] for e in errors} == {"invalid_json"}
    assert not any(e["fatal"] for e in errors)
    assert of_type(events, "session.ended")
    await back_to_baseline(fault_server, baseline)


async def test_flood_of_tiny_audio_over_grpc(fault_server: LiveServer) -> None:
    async def flood() -> list[tuple[str, Any]]:
        config = pb.RecognitionConfig(sample_rate=16000, partials=False)

        async def requests() -> Any:
            yield pb.RecognizeRequest(config=config)
            for seq in range(3000):
                yield pb.RecognizeRequest(audio=pb.AudioFrames(seq_id=seq, pcm=b"\0\0"))
            samples = utterances(600)
            for n, i in enumerate(range(0, samples.size, FRAME)):
                pcm = samples[i : i + FRAME].astype("<i2").tobytes()
                yield pb.RecognizeRequest(audio=pb.AudioFrames(seq_id=3000 + n, pcm=pcm))

        out: list[tuple[str, Any]] = []
        async with grpc.aio.insecure_channel(fault_server.grpc_target) as channel:
            async for response in stub(channel).Recognize(requests()):
                kind = response.WhichOneof("event")
                out.append((kind, getattr(response, kind)))
        return out

    baseline = await resources(fault_server)
    responses = await alongside(fault_server, flood())
    texts = [m.text for k, m in responses if k == "transcript" and m.is_final]
    assert texts == [word_for(600)]
    ended = next(m for k, m in responses if k == "ended")
    assert ended.received == ended.accepted == ended.processed == 3000 + 80  # 1.6 s of frames
    await back_to_baseline(fault_server, baseline)

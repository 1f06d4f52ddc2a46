"""SIGTERM under load, on a real `voxserve serve` process (the zero-cost load engines, so
the test is about the drain, not the models): live sessions finish their turn and get
`session.ended` reason `server_shutdown`, new ones are refused with a retry hint, a session
still speaking at the drain deadline is ended all the same, and the process exits 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.conftest import free_port
from tests.fakes import silence, tone
from tests.helpers import reap, wait_ready
from tests.transports.grpc_client import audio_requests, stub
from tests.transports.grpc_client import collect as grpc_collect
from tests.wsclient import collect, of_type, send_audio, start
from voxserve.v1 import voxserve_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int, Path]]:
    port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "VOXSERVE_LIMITS__DRAIN_TIMEOUT_S": "3",
        "VOXSERVE_CACHE__ENABLED": "false",
        # The assistant's echoed reply lasts ~1.8 s of paced audio: well into the drain.
        "VOXSERVE_ENGINES__ASR": '{"name": "load", "options": {"text": "%s"}}' % ("ab " * 10),
    }
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voxserve", "serve", "--config", "bench/load-engines.toml",
             "--port", str(port), "--grpc-port", str(grpc_port), "--wyoming-port", "0",
             "--log-level", "info"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_ready(proc, port, log)
        yield proc, port, grpc_port, log
    finally:
        reap(proc)


async def _mid_utterance(ws: ClientConnection) -> None:
    """Open an asr session and stop sending in the middle of speech."""
    await start(ws, mode="asr", partials=False)
    await send_audio(ws, np.concatenate([silence(0.2), tone(300, 0.6)]), speedup=4)


async def test_sigterm_drains_live_sessions_and_exits_zero(
    served: tuple[subprocess.Popen[bytes], int, int, Path],
) -> None:
    proc, port, grpc_port, log = served
    url = f"ws://127.0.0.1:{port}/v1/stream"
    listeners = [await connect(url) for _ in range(3)]
    speaker = await connect(url)
    long_talker = await connect(url)
    try:
        for ws in listeners[1:]:
            await _mid_utterance(ws)
        # An assistant: its turn goes on (the echoed reply is spoken) after the drain began.
        await start(listeners[0], mode="assistant")
        await send_audio(listeners[0], np.concatenate([silence(0.2), tone(300, 0.6)]), speedup=4)
        await start(speaker, mode="tts")
        await speaker.send(json.dumps({"type": "text", "text": "Short reply.", "flush": True}))
        await start(long_talker, mode="tts")  # ~12 s of paced audio: past the deadline
        await long_talker.send(json.dumps({"type": "text", "text": "word " * 40, "flush": True}))
        # A gRPC stream too, in the middle of an utterance.
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}")
        held = asyncio.Event()

        async def requests() -> Any:
            async for request in audio_requests(
                pb.RecognizeRequest,
                pb.RecognitionConfig(),
                np.concatenate([silence(0.2), tone(300, 0.6)]),
            ):
                yield request
            await held.wait()  # input stays open: the drain has to end it

        grpc_call = stub(channel).Recognize(requests())
        grpc_events = asyncio.create_task(grpc_collect(grpc_call, limit_s=10))
        await asyncio.sleep(0.3)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.1)
        # Audio sent after the drain began is refused once, then counted.
        for seq in (100, 101):
            await listeners[0].send(seq.to_bytes(4, "big") + b"\0\0" * 320)
        # Draining: not ready, and a new session is refused with a retry hint.
        ready = await asyncio.to_thread(httpx.get, f"http://127.0.0.1:{port}/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        async with connect(url) as late:  # told before it sends anything
            refused = json.loads(await asyncio.wait_for(late.recv(), 5))
        assert refused["code"] == "shutting_down" and refused["retry_after_ms"] > 0
        results: list[tuple[list[dict[str, Any]], list[bytes]]] = await asyncio.gather(
            *(collect(ws, limit_s=10) for ws in (*listeners, speaker, long_talker))
        )
        grpc_results = await grpc_events
    finally:
        held.set()
        for ws in (*listeners, speaker, long_talker):
            await ws.close()
        await channel.close()
    kinds = [kind for kind, _ in grpc_results]
    assert "transcript" in kinds and kinds[-1] == "ended", kinds  # the final, then ended
    assert grpc_results[-1][1].reason == "server_shutdown"
    for events, _ in results[:3]:  # the turn in progress was finished: its final arrived
        assert of_type(events, "transcript.final"), events
        ended = events[-1]
        assert ended["type"] == "session.ended" and ended["reason"] == "server_shutdown"
        assert ended["processed"] + ended["rejected"] == ended["received"]
    assistant = results[0][0]
    assert [e["code"] for e in of_type(assistant, "error")] == ["shutting_down"]
    assert assistant[-1]["rejected"] == 2 and of_type(assistant, "tts.end")
    speaker_events = results[3][0]
    assert of_type(speaker_events, "tts.end")[0]["interrupted"] is False
    assert speaker_events[-1]["reason"] == "server_shutdown"
    long_events = results[4][0]
    assert of_type(long_events, "tts.end")[0]["interrupted"] is True  # cut at the deadline
    assert long_events[-1]["reason"] == "server_shutdown"
    assert await asyncio.to_thread(proc.wait, 15) == 0, log.read_text()
    assert time.monotonic() - began < 3 + 2 + 5  # deadline + goodbye grace + shutdown
    text = log.read_text()
    assert '"msg": "drained"' in text and '"forced": 1' in text

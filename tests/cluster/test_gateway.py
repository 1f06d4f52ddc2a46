"""End to end: a real voxserve server whose ASR and TTS go through Ray Serve (the gateway
of `voxserve serve --cluster`), real WebSocket clients at real-time pace."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.cluster.conftest import TwoNodes, pid_alive, wait_until, where
from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import silence
from tests.helpers import fixture_audio, fixture_texts, wer
from tests.wsclient import collect, of_type, send_audio, start
from voxserve.cluster.gateway import cluster_settings


@pytest.fixture(scope="module")
def gateway(two_nodes: TwoNodes) -> Iterator[LiveServer]:
    settings = two_nodes.settings.model_copy(update={"port": free_port()})
    settings = cluster_settings(settings, two_nodes.address)
    assert settings.engines.asr.name == "ray"
    assert [s.name for s in settings.engines.tts] == ["ray", "ray"]
    live = start_server(settings)
    yield live
    stop_server(live)


async def test_a_stream_is_transcribed_through_the_cluster(gateway: LiveServer) -> None:
    audio = np.concatenate([fixture_audio("command.wav"), silence(0.8)])
    async with connect(gateway.ws_url) as ws:
        await start(ws, mode="asr")
        frames = await send_audio(ws, audio)
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws, limit_s=60)
    finals = of_type(events, "transcript.final")
    assert [f["text"] for f in finals] == [fixture_texts()["command.wav"]], events
    ended = events[-1]
    assert ended["received"] == frames == ended["processed"]
    assert gateway.runtime.engines.asr.info.model == "whisper/tiny.en"


async def test_an_assistant_reply_is_spoken_by_the_core(gateway: LiveServer) -> None:
    voices = {v.id for v in gateway.runtime.engines.voices()}
    assert voices == {"espeak-en", "load"}  # what the core serves
    question = np.concatenate([fixture_audio("command.wav"), silence(0.8)])
    async with connect(gateway.ws_url) as ws:
        started = await start(ws, mode="assistant", voice="espeak-en", output_sample_rate=16000)
        assert started["voice"] == "espeak-en"
        await send_audio(ws, question)
        events, audio = await collect(ws, until="tts.end", limit_s=60)
        await ws.send(json.dumps({"type": "audio.end"}))
        rest, _ = await collect(ws, limit_s=30)
    assert wer("what time is it", of_type(events, "transcript.final")[0]["text"]) <= 0.25
    assert of_type(events, "tts.start")[0]["sample_rate"] == 16000
    pcm = np.frombuffer(b"".join(audio), dtype="<i2")
    assert pcm.size > 16000 // 2 and np.abs(pcm).max() > 1000  # real speech came back
    assert not of_type(events + rest, "error")


async def test_killing_the_asr_replica_mid_stream_loses_no_turn(
    gateway: LiveServer, two_nodes: TwoNodes
) -> None:
    from ray import serve

    from voxserve.cluster.connect import ASR_DEPLOYMENT, asr_app

    asr = serve.get_deployment_handle(ASR_DEPLOYMENT, app_name=asr_app(two_nodes.config()))
    # The first turn ends at 1.56 s, the second starts at 3.08 s: the kill falls between them.
    # Silence goes on at real-time pace until the first final is back (on a loaded machine it
    # took longer than the second turn lasts), so the second turn always follows the kill.
    audio = fixture_audio("two_turns.wav")
    cut = int(2.6 * 16_000)
    first, second = audio[:cut], np.concatenate([audio[cut:], silence(0.8)])
    first_final, killed = asyncio.Event(), asyncio.Event()

    async def keep_talking(ws: ClientConnection) -> None:
        seq = await send_audio(ws, first)
        while not first_final.is_set():
            seq = await send_audio(ws, silence(0.1), first_seq=seq)
        await killed.wait()
        await send_audio(ws, second, first_seq=seq)

    async with connect(gateway.ws_url) as ws:
        await start(ws, mode="asr", partials=False)
        sender = asyncio.create_task(keep_talking(ws))
        events, _ = await collect(ws, until="transcript.final", limit_s=30)
        first_final.set()
        info = await asyncio.to_thread(where, asr, "en")
        os.kill(int(info["pid"]), signal.SIGKILL)  # the replica that holds English
        killed.set()
        await sender
        await ws.send(json.dumps({"type": "audio.end"}))
        rest, _ = await collect(ws, limit_s=60)  # never a hang: bounded by limit_s
    events += rest
    finals = of_type(events, "transcript.final")
    assert len(finals) == 2, [e["type"] for e in events]
    joined = " ".join(f["text"] for f in finals)
    assert wer(fixture_texts()["two_turns.wav"], joined) <= 0.15, joined
    assert not of_type(events, "error")
    assert wait_until(lambda: not pid_alive(int(info["pid"])), 5)
    # Serve replaces the replica; later tests expect both again.
    await asyncio.to_thread(
        wait_until, lambda: len({where(asr)["replica"] for _ in range(12)}) == 2, 60, 1
    )

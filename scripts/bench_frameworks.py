"""End of speech -> first reply audio through each agent framework (pyproject.toml: clients)
beside /v1/stream and the raw `openai` Realtime SDK, so a framework's own cost shows.

One voxserve server (a subprocess: `voxserve serve`, the default engines, the rules
responder), the same recording (tests/fixtures/command.wav, "What time is it?", 0.3 s of
silence before, 1.5 s after the words), sent at real-time pace in 20 ms pieces by
`--streams` sessions at once, `--rounds` times per client, each round on new connections. End
of speech: the instant the piece holding the words' last 20 ms went out; first reply audio: when the
framework hands the application its first piece of reply audio (the SDK and /v1/stream: the
first audio message read). Usage (repo root, the clients extra installed):

    PYTHONPATH=$PWD python scripts/bench_frameworks.py --streams 2 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.clients.audio import question_pcm  # noqa: E402
from tests.helpers import fixture_audio  # noqa: E402

LEAD_S = 0.3


def speech_end_s(samples: np.ndarray, window: int = 320) -> float:
    """Where the recording's speech ends: the end of its last 20 ms above 1% of the peak RMS
    (the file holds 0.5 s of silence after the words)."""
    x = samples.astype(np.float64)
    rms = np.array([np.sqrt(np.mean(x[i : i + window] ** 2)) for i in range(0, x.size, window)])
    loud = np.flatnonzero(rms > 0.01 * rms.max())
    return float((loud[-1] + 1) * window / 16_000)


SPEECH_S = speech_end_s(fixture_audio("command.wav"))
PIECE_S = 0.02
Turn = Callable[[int], Awaitable[float]]


async def paced(send: Callable[[bytes], Awaitable[None]], pcm: bytes, rate: int) -> float:
    """Send `pcm` in 20 ms pieces by the wall clock; the instant the speech's end went out."""
    step = int(rate * PIECE_S) * 2
    end_byte = int((LEAD_S + SPEECH_S) * rate) * 2
    start = time.monotonic()
    speech_end = 0.0
    for n, i in enumerate(range(0, len(pcm), step)):
        await send(pcm[i : i + step])
        if i < end_byte <= i + step:
            speech_end = time.monotonic()
        delay = start + (n + 1) * PIECE_S - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
    return speech_end


async def first_audio(speech: asyncio.Task[float], heard: asyncio.Future[float]) -> float:
    async with asyncio.timeout(30):
        end = await speech
        return await heard - end


async def timed_turn(
    send: Callable[[bytes], Awaitable[None]],
    read: Callable[[asyncio.Future[float]], Coroutine[Any, Any, None]],
    rate: int = 24_000,
) -> float:
    """One turn: the question paced out through `send` at `rate` while `read` sets the future
    it is handed at the first reply audio; end of speech -> that instant."""
    heard: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    reader = asyncio.create_task(read(heard))
    try:
        return await first_audio(asyncio.create_task(paced(send, question_pcm(rate), rate)), heard)
    finally:
        reader.cancel()


async def stream_turn(port: int) -> float:
    from websockets.asyncio.client import connect

    async with connect(f"ws://127.0.0.1:{port}/v1/stream") as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "assistant"}))
        json.loads(await ws.recv())
        seq = 0

        async def send(piece: bytes) -> None:
            nonlocal seq
            await ws.send(seq.to_bytes(4, "big") + piece)
            seq += 1

        async def read(heard: asyncio.Future[float]) -> None:
            async for message in ws:
                if isinstance(message, bytes):
                    heard.set_result(time.monotonic())
                    return

        return await timed_turn(send, read, 16_000)


async def sdk_turn(port: int) -> float:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    async with client.realtime.connect(model="gpt-realtime") as conn:

        async def send(piece: bytes) -> None:
            await conn.input_audio_buffer.append(audio=base64.b64encode(piece).decode())

        async def read(heard: asyncio.Future[float]) -> None:
            async for event in conn:
                if event.type in ("response.output_audio.delta", "response.audio.delta"):
                    heard.set_result(time.monotonic())
                    return

        return await timed_turn(send, read)


async def agents_turn(port: int) -> float:
    from agents.realtime import RealtimeAgent, RealtimeRunner

    runner = RealtimeRunner(RealtimeAgent(name="bench", instructions="Answer briefly."))
    url = f"ws://127.0.0.1:{port}/v1/realtime?model=gpt-realtime"
    session = await runner.run(model_config={"url": url, "api_key": "x"})
    async with session:

        async def read(heard: asyncio.Future[float]) -> None:
            async for event in session:
                if event.type == "audio":
                    heard.set_result(time.monotonic())
                    return

        return await timed_turn(session.send_audio, read)


async def pipecat_turn(port: int) -> float:
    from pipecat.frames.frames import InputAudioRawFrame, OutputAudioRawFrame
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

    from tests.clients.pipecat_harness import Collector, running

    llm = OpenAIRealtimeLLMService(api_key="x", base_url=f"ws://127.0.0.1:{port}/v1/realtime")
    pair = LLMContextAggregatorPair(LLMContext([{"role": "system", "content": "Be brief."}]))
    sink = Collector()
    async with running(pair.user(), llm, sink, pair.assistant()) as (worker, _):

        async def read(heard: asyncio.Future[float]) -> None:
            await sink.until(lambda frames: bool(sink.of(OutputAudioRawFrame)), limit_s=60)
            heard.set_result(time.monotonic())

        async def send(piece: bytes) -> None:
            frame = InputAudioRawFrame(audio=piece, sample_rate=24_000, num_channels=1)
            await worker.queue_frame(frame)

        await asyncio.sleep(0.5)  # the service connects on the pipeline's start
        return await timed_turn(send, read)


async def livekit_turn(port: int) -> float:
    from livekit import rtc
    from livekit.agents import llm, utils
    from livekit.plugins import openai as lk_openai

    async with utils.http_context.open():
        model = lk_openai.realtime.RealtimeModel(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="x"
        )
        session = model.session()
        heard: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        async def audio_of(message: llm.MessageGeneration) -> None:
            async for _ in message.audio_stream:
                if not heard.done():
                    heard.set_result(time.monotonic())

        tasks: set[asyncio.Task[None]] = set()  # kept until the session ends

        async def created(generation: llm.GenerationCreatedEvent) -> None:
            async for message in generation.message_stream:
                tasks.add(asyncio.create_task(audio_of(message)))

        session.on("generation_created", lambda g: tasks.add(asyncio.create_task(created(g))))

        async def send(piece: bytes) -> None:
            samples = len(piece) // 2
            session.push_audio(rtc.AudioFrame(piece, 24_000, 1, samples))

        try:
            return await first_audio(
                asyncio.create_task(paced(send, question_pcm(), 24_000)), heard
            )
        finally:
            await session.aclose()
            for task in tasks:
                task.cancel()


CLIENTS: dict[str, Turn] = {
    "/v1/stream (websockets)": stream_turn,
    "openai SDK realtime": sdk_turn,
    "Agents SDK RealtimeRunner": agents_turn,
    "pipecat OpenAIRealtimeLLMService": pipecat_turn,
    "LiveKit RealtimeModel session": livekit_turn,
}


def serve(port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "voxserve", "serve", "--port", str(port)]
    env = {**os.environ, "VOXSERVE_GRPC_PORT": "0", "VOXSERVE_WYOMING_PORT": "0"}
    proc = subprocess.Popen([*command, "--log-level", "warning"], env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not become ready")


async def measure(port: int, streams: int, rounds: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {name: [] for name in CLIENTS}
    for _ in range(rounds):
        for name, turn in CLIENTS.items():  # interleaved: each round, every client once
            got = await asyncio.gather(
                *(turn(port) for _ in range(streams)), return_exceptions=True
            )
            for value in got:
                if isinstance(value, BaseException):
                    print(f"{name}: {type(value).__name__}: {value}", file=sys.stderr)
                else:
                    results[name].append(value)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    server = serve(args.port)
    try:
        results = asyncio.run(measure(args.port, args.streams, args.rounds))
    finally:
        server.terminate()
        server.wait(timeout=30)
    base = statistics.median(results["openai SDK realtime"] or [float("nan")])
    print("| client | turns | P50 ms | P90 ms | max ms | P50 vs raw SDK |")
    print("|---|---|---|---|---|---|")
    for name, values in results.items():
        if not values:
            print(f"| {name} | 0 | - | - | - | - |")
            continue
        ms = np.array(values) * 1000
        p50, p90 = np.percentile(ms, 50), np.percentile(ms, 90)
        print(
            f"| {name} | {len(values)} | {p50:.0f} | {p90:.0f} | {ms.max():.0f} "
            f"| {p50 - base * 1000:+.0f} |"
        )


if __name__ == "__main__":
    main()

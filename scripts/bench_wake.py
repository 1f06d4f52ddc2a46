"""Wake-word CPU per stream: N Wyoming wake streams at real-time pace against one server.

    .venv/bin/python scripts/bench_wake.py --streams 1,20,60 --duration 20 [--names okay_nabu]
    .venv/bin/python scripts/bench_wake.py --peer 'PEER_VENV/bin/wyoming-openwakeword
        --uri tcp://127.0.0.1:{port} --preload-model ok_nabu' --names ok_nabu

Starts voxserve (the `load` engines for VAD/ASR/TTS, so the wake models are all that
works; the wake service is the real one) or a peer Wyoming wake server (`--peer`, a command
with `{port}`), pinned to core 0, and for each step runs N streams from this process
pinned to core 1: `detect` (--names), `audio-start`, then 64 ms `audio-chunk`s on a
real-time schedule for --duration seconds (speech: the test fixtures, looped), `audio-stop`.
Per step: the server's CPU over the steady part (after 2 s), less its idle CPU, per stream
(% of one core), streams per core (100 / that), detections per stream, and how late this
generator sent (a step whose P99 lateness passes 64 ms is marked not valid). Prints a
Markdown table and writes results.json under --out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import tempfile
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.wake import Detect

from voxserve.bench.procstat import pin
from voxserve.bench.servers import HOST, free_port, spawn_tcp, spawn_voxserve

RATE = 16_000
CHUNK_SAMPLES = 1024  # 64 ms, what satellites send
RAMP_S = 2.0
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
# The `load` engines for VAD/ASR/TTS (cost ~0): the wake models are all the server runs.
LOAD_ENGINES = {
    "VOXSERVE_ENGINES__VAD": '{"name": "load"}',
    "VOXSERVE_ENGINES__ASR": '{"name": "load", "options": {"text": "load test"}}',
    "VOXSERVE_ENGINES__TTS": '[{"name": "load"}]',
    "VOXSERVE_ENGINES__RESPONDER": '{"name": "echo"}',
    "VOXSERVE_ENGINES__DEFAULT_VOICE": "load",
    "VOXSERVE_LIMITS__MAX_SESSIONS": "5000",
}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def speech() -> bytes:
    """The test fixtures back to back: speech, so the models see what a satellite sends."""
    parts = []
    for name in ("lights.wav", "weather.wav", "reminder.wav", "command.wav", "long.wav"):
        with wave.open(str(FIXTURES / name), "rb") as wav:
            parts.append(wav.readframes(wav.getnframes()))
    return b"".join(parts)


@contextlib.contextmanager
def server(peer: str | None, log: Path) -> Iterator[tuple[int, int]]:
    """(pid, Wyoming port) of voxserve or the peer, pinned to core 0; always stopped."""
    port = free_port()
    if not peer:
        env = {**LOAD_ENGINES, "VOXSERVE_WYOMING_PORT": str(port)}
        with spawn_voxserve(log, env=env) as spawned:
            pin(spawned.pid)
            yield spawned.pid, port
        return
    with spawn_tcp(shlex.split(peer.format(port=port)), port, log) as pid:
        pin(pid)
        yield pid, port


async def one_stream(
    port: int, audio: bytes, names: list[str], start_at: float, duration: float, offset: int
) -> dict[str, Any]:
    """One satellite: detect, then real-time chunks; its detections and send lateness."""
    step = CHUNK_SAMPLES * 2
    chunks = int(duration * RATE / CHUNK_SAMPLES)
    late: list[float] = []
    detections = 0
    async with AsyncTcpClient(HOST, port) as client:

        async def reader() -> None:
            nonlocal detections
            while (event := await client.read_event()) is not None:
                if event.type == "detection":
                    detections += 1
                elif event.type in ("not-detected", "error"):
                    return

        task = asyncio.create_task(reader())
        await client.write_event(Detect(names=names).event())
        await client.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
        for i in range(chunks):
            due = start_at + i * CHUNK_SAMPLES / RATE
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                late.append(-delay)
            at = (offset + i * step) % (len(audio) - step)
            chunk = AudioChunk(rate=RATE, width=2, channels=1, audio=audio[at : at + step])
            await client.write_event(chunk.event())
        await client.write_event(AudioStop().event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(task, 5)
    return {"detections": detections, "late": late, "chunks": chunks}


async def run_step(
    pid: int, port: int, streams: int, names: list[str], duration: float
) -> dict[str, Any]:
    audio = speech()
    idle0, t0 = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(3.0)
    idle = (cpu_seconds(pid) - idle0) / (time.monotonic() - t0)
    start_at = time.monotonic() + 1.0
    tasks = [
        asyncio.create_task(one_stream(port, audio, names, start_at, duration, offset=i * 7919 * 2))
        for i in range(streams)
    ]
    await asyncio.sleep(max(0.0, start_at + RAMP_S - time.monotonic()))
    cpu0, w0 = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(max(0.0, start_at + duration - 0.5 - time.monotonic()))
    busy = (cpu_seconds(pid) - cpu0) / (time.monotonic() - w0)
    results = await asyncio.gather(*tasks)
    late = np.array([x for r in results for x in r["late"]] or [0.0])
    chunks = sum(r["chunks"] for r in results)
    per_stream = max(0.0, busy - idle) / streams * 100
    return {
        "streams": streams,
        "server_cpu_pct": round(busy * 100, 1),
        "idle_cpu_pct": round(idle * 100, 1),
        "cpu_per_stream_pct": round(per_stream, 3),
        "streams_per_core": round(100 / per_stream) if per_stream else None,
        "detections_per_stream": round(sum(r["detections"] for r in results) / streams, 2),
        "late_chunks_pct": round(100 * np.count_nonzero(late > 0) / max(1, chunks), 1),
        "late_p99_ms": round(float(np.percentile(late, 99)) * 1000, 1),
        "valid": float(np.percentile(late, 99)) < CHUNK_SAMPLES / RATE,
    }


def engine_only(names: list[str], streams: int) -> dict[str, Any]:
    """The engine alone, in this process: model CPU per second of audio per stream (one
    stream, 60 s of speech, 64 ms chunks), and memory per stream (RSS growth for `streams`
    streams, each fed a second of audio so every interpreter has run)."""
    from voxserve.engines.micro_wakeword import MicroWakeWordEngine

    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    engine = MicroWakeWordEngine(models=names)
    audio = speech()
    audio = (audio * (1 + 60 * RATE * 2 // len(audio)))[: 60 * RATE * 2]
    stream = engine.new_stream(names)
    step = CHUNK_SAMPLES * 2
    cpu0 = time.process_time()
    for i in range(0, len(audio), step):
        stream.process(audio[i : i + step])
    cpu = time.process_time() - cpu0
    stream.close()
    before = rss()
    many = [engine.new_stream(names) for _ in range(streams)]
    for s in many:
        for i in range(0, RATE * 2, step):
            s.process(audio[i : i + step])
    per_stream = (rss() - before) / streams
    return {
        "models": names,
        "cpu_per_stream_pct": round(cpu / 60 * 100, 3),
        "streams_per_core": round(60 / cpu),
        "rss_per_stream_kib": round(per_stream / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,20,60")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--names", default="okay_nabu", help="comma-separated model names")
    parser.add_argument("--peer", default=None, help="a peer server command with {port}")
    parser.add_argument(
        "--engine-only", action="store_true", help="the engine in this process, no server"
    )
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="wake-")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.sched_setaffinity(0, {1 % (os.cpu_count() or 1)})
    names = [n for n in args.names.split(",") if n]
    if args.engine_only:
        print(json.dumps(engine_only(names, 200)))
        return
    rows = []
    with server(args.peer, args.out / "server.log") as (pid, port):
        for streams in (int(s) for s in args.streams.split(",")):
            rows.append(asyncio.run(run_step(pid, port, streams, names, args.duration)))
            print(json.dumps(rows[-1]), flush=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    print(
        "| streams | server CPU % | idle % | CPU per stream (% of a core) | streams per core "
        "| detections per stream | late chunks % | valid |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['streams']} | {r['server_cpu_pct']} | {r['idle_cpu_pct']} "
            f"| {r['cpu_per_stream_pct']} | {r['streams_per_core']} "
            f"| {r['detections_per_stream']} | {r['late_chunks_pct']} | {r['valid']} |"
        )


if __name__ == "__main__":
    main()

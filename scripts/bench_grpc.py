"""Paced streams over gRPC vs the WebSocket, frames per message 1 vs 5, on one server core.

    .venv/bin/python scripts/bench_grpc.py --steps 50,100,200 --duration 15 --out DIR

For each transport and frames-per-message setting, the script starts its own voxserve (the
`load` engines: costs ~0, so the figures are the server's own overhead) pinned to core 0
(`taskset`), runs N paced asr streams from this process pinned to core 1, and records per
step: the server's CPU (100 = its one core), the mark lag (a `mark` every 0.5 s per stream,
echoed once all audio before it went through VAD) P50/P99, and this generator's own send
lateness and CPU (a step where the generator is late or busy is marked not valid). The knee
is the last valid step whose mark-lag P99 is within --budget-ms. Audio is quiet noise
(-60 dBFS): every frame goes through the ring and the VAD, none makes a turn. Writes
results.json and prints a Markdown table. Bounded: every step ends after ramp + duration +
drain seconds, and the servers are always stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from voxserve.bench.servers import HOST, free_port, running, wait_until

FRAME_SAMPLES = 320  # 20 ms at 16 kHz
MARK_EVERY_S = 0.5
LOAD_CONFIG = """
[engines]
vad = { name = "load" }
asr = { name = "load", options = { text = "load test" } }
tts = [{ name = "load" }]
responder = { name = "echo" }
default_voice = "load"

[limits]
max_sessions = 5000
"""


def pinned(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if shutil.which("taskset") else []


@dataclass
class Server:
    pid: int
    http_port: int
    grpc_port: int


@contextlib.contextmanager
def spawn_server(core: int, log: Path) -> Iterator[Server]:
    """voxserve with the load engines on free ports, pinned to `core`; always stopped."""
    config = Path(tempfile.mkdtemp()) / "load.toml"
    config.write_text(LOAD_CONFIG)
    http_port, grpc_port = free_port(), free_port()
    command = [*pinned(core), sys.executable, "-m", "voxserve", "serve", "--config", str(config)]
    command += ["--port", str(http_port), "--grpc-port", str(grpc_port), "--wyoming-port", "0"]
    command += ["--log-level", "warning"]
    readyz = f"http://{HOST}:{http_port}/readyz"
    with running(command, log, None) as proc:
        wait_until(lambda: httpx.get(readyz, timeout=1).status_code == 200, proc, log, 60)
        yield Server(proc.pid, http_port, grpc_port)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Samples:
    mark_lag: list[float] = field(default_factory=list)
    lateness: list[float] = field(default_factory=list)
    errors: int = 0
    unanswered: int = 0


def noise(seconds: float) -> bytes:
    rng = np.random.default_rng(7)
    samples = rng.normal(0, 32768 * 10 ** (-60 / 20), int(seconds * 16_000))
    return samples.astype("<i2").tobytes()


AUDIO = noise(10.0)


class Stream:
    """One paced stream; `measure_from` is when its samples start to count."""

    def __init__(self, fpm: int, start_at: float, end_at: float, measure_from: float) -> None:
        self.fpm = fpm
        self.start_at = start_at
        self.end_at = end_at
        self.measure_from = measure_from
        self.marks: dict[str, float] = {}

    def schedule(self) -> Iterator[tuple[int, float, bytes, str | None]]:
        """(seq, due time, PCM, mark id or None) per message until end_at."""
        step = FRAME_SAMPLES * 2 * self.fpm
        interval = 0.02 * self.fpm
        every = max(1, round(MARK_EVERY_S / interval))
        n = 0
        while (due := self.start_at + (n + 1) * interval) < self.end_at:
            offset = (n * step) % (len(AUDIO) - step)
            mark = f"m{n}" if n % every == every - 1 else None
            yield n * self.fpm, due, AUDIO[offset : offset + step], mark
            n += 1

    def answered(self, mark_id: str, samples: Samples) -> None:
        sent = self.marks.pop(mark_id, None)
        if sent is not None and sent >= self.measure_from:
            samples.mark_lag.append(time.monotonic() - sent)


async def pace(due: float, stream: Stream, samples: Samples) -> None:
    delay = due - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    elif due >= stream.measure_from:
        samples.lateness.append(-delay)


async def ws_stream(port: int, stream: Stream, samples: Samples) -> None:
    from websockets.asyncio.client import connect

    await asyncio.sleep(max(0.0, stream.start_at - time.monotonic()))
    async with connect(f"ws://{HOST}:{port}/v1/stream", max_queue=None) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "asr", "partials": False}))
        await ws.recv()

        async def receive() -> None:
            async for message in ws:
                if isinstance(message, str) and '"mark"' in message:
                    event = json.loads(message)
                    if event.get("type") == "mark":
                        stream.answered(str(event["id"]), samples)
                    elif event.get("type") == "error":
                        samples.errors += 1

        reader = asyncio.create_task(receive())
        for seq, due, pcm, mark in stream.schedule():
            await pace(due, stream, samples)
            await ws.send(seq.to_bytes(4, "big") + pcm)
            if mark:
                stream.marks[mark] = time.monotonic()
                await ws.send(json.dumps({"type": "mark", "id": mark}))
        await ws.send(json.dumps({"type": "audio.end"}))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(reader, 10)


async def grpc_stream(channel: Any, stream: Stream, samples: Samples) -> None:
    import grpc

    from voxserve.v1 import voxserve_pb2 as pb
    from voxserve.v1 import voxserve_pb2_grpc as pb_grpc

    await asyncio.sleep(max(0.0, stream.start_at - time.monotonic()))
    call = pb_grpc.VoxserveStub(channel).Converse()
    config = pb.StreamConfig(mode=pb.MODE_ASR, partials=False)
    await call.write(pb.ConverseRequest(config=config))
    await call.read()

    async def receive() -> None:
        while True:
            response = await call.read()
            if response is grpc.aio.EOF:
                return
            kind = response.WhichOneof("event")
            if kind == "mark":
                stream.answered(response.mark.id, samples)
            elif kind == "error":
                samples.errors += 1
            elif kind == "ended":
                return

    reader = asyncio.create_task(receive())
    for seq, due, pcm, mark in stream.schedule():
        await pace(due, stream, samples)
        await call.write(pb.ConverseRequest(audio=pb.AudioFrames(seq_id=seq, pcm=pcm)))
        if mark:
            stream.marks[mark] = time.monotonic()
            await call.write(pb.ConverseRequest(mark=pb.Mark(id=mark)))
    await call.done_writing()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(reader, 10)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest rank: always a measured value."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(np.ceil(q / 100 * len(ordered))) - 1))]


@dataclass(frozen=True)
class Part:
    """What one load process runs: streams [first, first + count) of `total`."""

    transport: str
    http_port: int
    grpc_port: int
    total: int
    first: int
    count: int
    fpm: int
    start_at: float
    ramp: float
    measure_from: float
    end_at: float
    channels: int


def run_part(part: Part) -> dict[str, Any]:
    """Entry point of a load process (time.monotonic is one clock for all processes)."""
    return asyncio.run(_run_part(part))


async def _run_part(part: Part) -> dict[str, Any]:
    import grpc

    samples = Samples()
    channels = [
        grpc.aio.insecure_channel(f"{HOST}:{part.grpc_port}")
        for _ in range(min(part.channels, part.count) if part.transport == "grpc" else 0)
    ]
    streams, tasks = [], []
    for i in range(part.first, part.first + part.count):
        start = part.start_at + part.ramp * i / part.total
        stream = Stream(part.fpm, start, part.end_at, part.measure_from)
        streams.append(stream)
        if part.transport == "ws":
            tasks.append(ws_stream(part.http_port, stream, samples))
        else:
            tasks.append(grpc_stream(channels[(i - part.first) % len(channels)], stream, samples))
    cpu = 0.0

    async def own_cpu() -> None:
        nonlocal cpu
        await asyncio.sleep(max(0.0, part.measure_from - time.monotonic()))
        before = time.process_time()
        await asyncio.sleep(max(0.1, part.end_at - 0.5 - time.monotonic()))
        cpu = time.process_time() - before

    timeout = part.end_at - time.monotonic() + 30
    results = await asyncio.wait_for(
        asyncio.gather(own_cpu(), *tasks, return_exceptions=True), timeout
    )
    for channel in channels:
        await channel.close()
    failures = [repr(r) for r in results if isinstance(r, BaseException)]
    return {
        "mark_lag": samples.mark_lag,
        "lateness": samples.lateness,
        "errors": samples.errors,
        "unanswered": sum(len(s.marks) for s in streams),
        "failures": failures,
        "cpu_s": cpu,
    }


def run_step(
    pool: Any, transport: str, server: Server, streams: int, fpm: int, args: argparse.Namespace
) -> dict[str, Any]:
    start_at = time.monotonic() + 2.0  # time for the load processes to be ready
    ramp = min(4.0, args.duration / 3)
    measure_from = start_at + ramp + 1.0
    end_at = start_at + ramp + args.duration
    procs = max(1, min(args.procs, streams))
    parts = [
        Part(
            transport,
            server.http_port,
            server.grpc_port,
            streams,
            k * streams // procs,
            (k + 1) * streams // procs - k * streams // procs,
            fpm,
            start_at,
            ramp,
            measure_from,
            end_at,
            args.channels or streams,
        )
        for k in range(procs)
    ]
    futures = [pool.submit(run_part, part) for part in parts]
    time.sleep(max(0.0, measure_from - time.monotonic()))
    s0, t0 = cpu_seconds(server.pid), time.monotonic()
    time.sleep(max(0.1, end_at - 0.5 - time.monotonic()))
    cpu_server, wall = cpu_seconds(server.pid) - s0, time.monotonic() - t0
    outs = [future.result(timeout=end_at - time.monotonic() + 60) for future in futures]
    lags = [x for out in outs for x in out["mark_lag"]]
    late = [x for out in outs for x in out["lateness"]]
    failures = [f for out in outs for f in out["failures"]]
    lag_p99 = percentile(lags, 99)
    late_p99 = percentile(late, 99) or 0.0
    generator_cpu = [100 * out["cpu_s"] / wall for out in outs]
    record = {
        "transport": transport,
        "frames_per_message": fpm,
        "streams": streams,
        "load_processes": procs,
        "server_cpu_pct": round(100 * cpu_server / wall, 1),
        "generator_cpu_pct": round(sum(generator_cpu), 1),
        "mark_lag_p50_ms": _ms(percentile(lags, 50)),
        "mark_lag_p99_ms": _ms(lag_p99),
        "marks": len(lags),
        "marks_unanswered": sum(out["unanswered"] for out in outs),
        "send_lateness_p99_ms": _ms(late_p99),
        "failed_streams": len(failures),
        "errors": sum(out["errors"] for out in outs),
        "failure": failures[0] if failures else None,
    }
    # The generator's core is shared by its processes: together under 90% of it.
    valid = late_p99 * 1000 <= args.max_lateness_ms and sum(generator_cpu) < 90
    record["valid"] = valid and not failures
    record["within_budget"] = (
        lag_p99 is not None and lag_p99 * 1000 <= args.budget_ms and not failures
    )
    return record


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="50,100,150,200,300")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds measured per step")
    parser.add_argument("--budget-ms", type=float, default=50.0, help="mark-lag P99 budget")
    parser.add_argument("--max-lateness-ms", type=float, default=10.0)
    parser.add_argument(
        "--channels",
        type=int,
        default=0,
        help="gRPC channels (connections) per load process; 0: one per stream, as the "
        "WebSocket has",
    )
    parser.add_argument("--procs", type=int, default=1, help="load processes (all on core 1)")
    parser.add_argument(
        "--configs",
        default="ws:1,ws:5,grpc:1,grpc:5",
        help="transport:frames-per-message, comma-separated",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-grpc"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {1})  # the generator on core 1, the server on core 0
    steps = [int(n) for n in args.steps.split(",")]
    records = []
    for item in args.configs.split(","):
        transport, fpm = item.split(":")
        with (
            spawn_server(0, args.out / "server.log") as server,
            ProcessPoolExecutor(args.procs) as pool,
        ):
            for streams in steps:
                record = run_step(pool, transport, server, streams, int(fpm), args)
                records.append(record)
                print(json.dumps(record), flush=True)
                if not record["valid"] or not record["within_budget"]:
                    break
    (args.out / "results.json").write_text(json.dumps(records, indent=2))
    print(table(records, args.budget_ms))
    return 0


def table(records: list[dict[str, Any]], budget_ms: float) -> str:
    lines = [
        "| transport | frames/msg | streams | server CPU % | mark lag P50 / P99 ms "
        "| generator late P99 ms / CPU % | valid | P99 within " + f"{budget_ms:g} ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['transport']} | {r['frames_per_message']} | {r['streams']} "
            f"| {r['server_cpu_pct']} | {r['mark_lag_p50_ms']} / {r['mark_lag_p99_ms']} "
            f"| {r['send_lateness_p99_ms']} / {r['generator_cpu_pct']} "
            f"| {'yes' if r['valid'] else 'no'} | {'yes' if r['within_budget'] else 'no'} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

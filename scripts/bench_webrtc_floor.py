"""What a WebRTC call costs voxserve against what it costs aiortc bare (issue 39, part 1):
the same callers (voxserve's bench caller, `voxserve/bench/webrtc_client.py`: Opus at 48 kHz,
a recording paced at 20 ms frames, looped) call two servers in turn, each alone on core 0:
- `echo`: the bare aiortc peer (`voxserve/bench/webrtc_echo.py`): answers the POST, echoes
  the audio back on the same track, nothing else: aiortc's own floor per call;
- `voxserve`: `voxserve serve --config bench/load-engines.toml` (engines that cost nothing),
  `POST /v1/realtime/calls`: VAD, turns, the session, reply pacing, silence when quiet.
Both decode 50 Opus frames a second per call and encode 50 back. The server's CPU (its
process, all threads) is sampled over a steady window once every call is connected; the
callers run on core 1. Rounds alternate the servers (ABBA) so drift on the shared machine
falls on both.

    .venv/bin/python -m scripts.bench_webrtc_floor --calls 1,4,8 --seconds 20 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from voxserve.audio.wav import read_wav
from voxserve.bench.procstat import between, pin, snapshot
from voxserve.bench.servers import HOST, free_port, spawn_tcp, spawn_voxserve
from voxserve.bench.webrtc_client import FRAME_BYTES, FrameSource, WebRtcCaller, to_48k

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "tests" / "fixtures" / "long.wav"


def looped_source() -> FrameSource:
    """The recording and 1 s of silence, looped for as long as the call lasts."""
    pcm, rate = read_wav(RECORDING.read_bytes())
    pcm = np.concatenate([pcm, np.zeros(rate, dtype=np.int16)])
    clip = to_48k(pcm, rate)
    frames = len(clip) // FRAME_BYTES

    def frame(k: int) -> bytes:
        k %= frames
        return clip[k * FRAME_BYTES : (k + 1) * FRAME_BYTES]

    return frame


@contextlib.contextmanager
def spawn_webrtc_echo(log: Path) -> Iterator[tuple[str, int]]:
    """The bare aiortc peer on a free port: its base URL and pid once the port accepts."""
    port = free_port()
    cmd = [sys.executable, "-m", "voxserve.bench.webrtc_echo", "--port", str(port)]
    with spawn_tcp(cmd, port, log) as pid:
        yield f"http://{HOST}:{port}", pid


@contextlib.contextmanager
def spawn_target(name: str, log: Path) -> Iterator[tuple[str, int]]:
    if name == "echo":
        with spawn_webrtc_echo(log) as target:
            yield target
        return
    config = str(ROOT / "bench" / "load-engines.toml")
    with spawn_voxserve(log, config=config) as spawned:
        yield spawned.url.replace("ws://", "http://").rsplit("/v1/", 1)[0], spawned.pid


async def measure(base: str, pid: int, calls: int, seconds: float) -> dict[str, float]:
    """`calls` callers connected, 2 s to settle, then the server's CPU over `seconds`."""
    source = looped_source()  # read once: every caller says the same
    callers = [WebRtcCaller(source) for _ in range(calls)]
    try:
        started = time.monotonic()
        await asyncio.gather(*(c.call(base, None) for c in callers))
        connect_s = time.monotonic() - started
        await asyncio.sleep(2.0)
        before = snapshot(pid)
        await asyncio.sleep(seconds)
        window = between(before, snapshot(pid))
        heard = [c.heard.frames for c in callers]
    finally:
        for caller in callers:
            with contextlib.suppress(Exception):
                await caller.hang_up()
            with contextlib.suppress(Exception):
                await caller.close()
    return {
        "calls": calls,
        "server_cpu_percent": window["cpu_percent"],
        "cpu_per_call": round(window["cpu_percent"] / calls, 2),
        "machine_cpu_percent": window["machine_cpu_percent"] or 0.0,
        "connect_s": round(connect_s, 3),
        "frames_heard_min": min(heard),
    }


def run_one(name: str, calls: int, seconds: float, log: Path) -> dict[str, float]:
    """A fresh server per measurement, with a log of its own (readiness is read from it)."""
    with spawn_target(name, log) as (base, pid):
        pin(pid, 0)
        return {"server": name, **asyncio.run(measure(base, pid, calls, seconds))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", default="1,4,8", help="concurrent calls per step")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window per step")
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds per step")
    parser.add_argument("--out", type=Path, help="write every measurement here (JSON lines)")
    args = parser.parse_args()
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})  # the callers; the server gets core 0
    logs = Path(tempfile.mkdtemp(prefix="webrtc-floor-"))
    rows: list[dict[str, float]] = []
    for calls in [int(c) for c in args.calls.split(",")]:
        for r in range(args.rounds):
            order = ("echo", "voxserve") if r % 2 == 0 else ("voxserve", "echo")
            for name in order:
                row = run_one(name, calls, args.seconds, logs / f"{name}-{calls}-{r}.log")
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    with args.out.open("a") as out:
                        out.write(json.dumps(row) + "\n")
    print("\n| calls | bare aiortc echo: CPU per call | voxserve: CPU per call | voxserve / echo |")
    print("|---|---|---|---|")
    for calls in sorted({int(r["calls"]) for r in rows}):

        def per_call(name: str, n: int = calls) -> float:
            return statistics.mean(
                r["cpu_per_call"] for r in rows if r["server"] == name and r["calls"] == n
            )

        echo, vox = per_call("echo"), per_call("voxserve")
        print(f"| {calls} | {echo:.1f}% | {vox:.1f}% | {vox / echo:.2f}x |")
    print(f"\nlogs: {logs}")


if __name__ == "__main__":
    main()

"""The server's memory over one hostile speech request: 3.5 KB of digits and commas sent to
POST /v1/audio/speech (piper), the whole answer read for at most --read-s seconds, the
server's RSS sampled every 50 ms (docs/reliability.md "Hostile text and memory").

    .venv/bin/python -m scripts.hostile_speech_request [--root DIR] [--read-s 400]

Starts its own `voxserve serve` from --root (default this checkout; give an older checkout
to measure it), warms it up with one short request, then reports: the status, time to the
first byte, seconds of audio received, the peak RSS growth and the RSS left after. A
watchdog kills the server at 3 GB of growth (unbounded engine work grew one by 300 MB/s).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx

from scripts.ready_server import ready_server
from voxserve.bench.servers import free_port

TEXT = ",".join(["1,234,567,890"] * 300)[:3500]
WATCHDOG_BYTES = 3_000_000_000
PCM_BYTES_PER_S = 24_000 * 2  # response_format pcm: 24 kHz 16-bit mono


def rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--read-s", type=float, default=400.0)
    args = parser.parse_args()
    port = free_port()
    cache = tempfile.mkdtemp(prefix="voxserve-hostile-")
    env = dict(os.environ, PYTHONPATH=args.root, XDG_CACHE_HOME=cache)
    url = f"http://127.0.0.1:{port}"
    flags = ("--wyoming-port", "0", "--log-level", "warning")
    with ready_server(args.root, port, env, *flags) as server:
        warm = {"input": "Warm up, please.", "voice": "joe"}
        httpx.post(f"{url}/v1/audio/speech", json=warm, timeout=60)
        time.sleep(1)
        print(measure(server, url, args.read_s), flush=True)


def measure(server: subprocess.Popen[bytes], url: str, read_s: float) -> str:
    base = rss_of(server.pid)
    peak = [base]
    killed: list[float] = []
    started = time.monotonic()

    def watch() -> None:
        while server.poll() is None:
            rss = rss_of(server.pid)
            peak[0] = max(peak[0], rss)
            if rss - base > WATCHDOG_BYTES:
                killed.append(time.monotonic() - started)
                server.kill()
                return
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    status: int | None = None
    first_s: float | None = None
    received = 0
    failure = ""
    body = {"input": TEXT, "voice": "joe", "response_format": "pcm"}
    try:
        with httpx.stream(
            "POST", f"{url}/v1/audio/speech", json=body, timeout=httpx.Timeout(read_s)
        ) as response:
            status = response.status_code
            for part in response.iter_bytes():
                first_s = first_s or time.monotonic() - started
                received += len(part)
                if time.monotonic() - started > read_s:
                    break
    except httpx.HTTPError as exc:
        failure = type(exc).__name__
    took = time.monotonic() - started
    time.sleep(2)
    left = rss_of(server.pid) - base if server.poll() is None else 0
    outcome = f"killed at {killed[0]:.1f} s" if killed else "alive"
    first = f"{first_s:.2f}" if first_s is not None else "none"
    return (
        f"status {status} {failure}| first byte {first} s | audio {received / PCM_BYTES_PER_S:.0f}"
        f" s in {took:.0f} s | peak RSS growth {(peak[0] - base) / 1e6:.0f} MB | left"
        f" {left / 1e6:.0f} MB | server {outcome} (RSS at start {base / 1e6:.0f} MB)"
    )


if __name__ == "__main__":
    main()

"""The server's RSS and a live stream's lag while 8 upload bombs arrive at once, on a
default `voxserve serve` (docs/reliability.md "Uploads", docs/benchmarks.md).

    .venv/bin/python -m scripts.hostile_upload_bombs [--root DIR]

Bombs (made as tests/hostile/test_uploads.py makes them), two of each: a 1.8 h FLAC whose
header says so (1 MB), 2 h of Ogg Opus (1.3 MB), a 2 h FLAC whose header says nothing, 2 h
of MP3 without a Xing header (7 MB). First the live stream alone for as long (its baseline
lag), then the attack beside it: prints each answer and time, the RSS peak growth and the
live stream's P50/P99 ping lag (tests/hostile/watch.py; killed at 3 GB of growth)."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.hostile.test_uploads import flac_says, silence
from tests.hostile.watch import watched


def _bombs() -> list[tuple[str, bytes]]:
    made = {
        "flac 1.8 h (header)": flac_says(silence("flac", 6_480), 6_480 * 16_000),
        "ogg opus 2 h (header)": silence("ogg", 7_200),
        "flac 2 h (no length)": flac_says(silence("flac", 7_200), 0),
        "mp3 2 h (no xing)": silence("mp3", 7_200, xing=False),
    }
    return [item for item in made.items() for _ in range(2)]


async def _send(http: httpx.AsyncClient, url: str, name: str, data: bytes) -> str:
    started = time.monotonic()
    answer = await http.post(url, files={"file": ("bomb", data)}, data={"model": "whisper-1"})
    code = answer.json().get("error", {}).get("code", "") if answer.status_code >= 400 else ""
    return f"{name}: {answer.status_code} {code} in {time.monotonic() - started:.2f} s"


async def _run(base: str, pid: int) -> None:
    bombs = _bombs()
    async with watched(base, pid=pid) as calm:
        await asyncio.sleep(8)
    async with httpx.AsyncClient(timeout=120) as http, watched(base, pid=pid) as watch:
        lines = await asyncio.gather(
            *(_send(http, base + "/v1/audio/transcriptions", n, d) for n, d in bombs)
        )
    print("\n".join(lines))
    print(
        f"live stream alone: P50 {calm.lag_ms(0.5):.1f} ms, P99 {calm.lag_ms(0.99):.1f} ms\n"
        f"8 bombs at once: RSS start {watch.rss_start / 1e6:.0f} MB, peak growth "
        f"{watch.rss_growth_mb:.0f} MB; live P50 {watch.lag_ms(0.5):.1f} ms, "
        f"P99 {watch.lag_ms(0.99):.1f} ms; transcript {watch.transcript()!r}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    args = parser.parse_args()
    port = int(os.environ.get("PORT", "0")) or _free_port()
    env = dict(os.environ, PYTHONPATH=args.root, XDG_CACHE_HOME=tempfile.mkdtemp())
    serve = [sys.executable, "-m", "voxserve", "serve", "--port", str(port)]
    serve += ["--grpc-port", "0", "--wyoming-port", "0", "--log-level", "warning"]
    server = subprocess.Popen(serve, env=env, cwd=args.root)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        asyncio.run(_run(base, server.pid))
    finally:
        server.terminate()
        server.wait(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


if __name__ == "__main__":
    main()

"""Figures for the TTS cache (docs/benchmarks.md, "TTS cache"), measured inside the server
process: the same `synthesize()` every transport calls, with the real default engines.

    .venv/bin/python scripts/bench_tts_cache.py [--hits 20000] [--misses 12] [--recovery-mb 100]
    .venv/bin/python scripts/bench_tts_cache.py --http-only --format mp3   # 4. only, as mp3

1. Hit latency: time to the first chunk and to the last, over cached sentences.
2. Miss latency with the cache and without it (`cache.enabled = false`), the same new
   sentences alternating between the two runtimes, so both see the same machine.
3. Recovery: how long a start-up takes to read back a cache of N MB from disk.
4. HTTP hits per core: a real `voxserve serve` process answers N cached speech requests
   from a closed-loop client; hits per second of the server's own CPU time (from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from voxserve.cache.entry import Entry
from voxserve.cache.store import Put, SqliteStore
from voxserve.cache.tts_cache import TtsCache
from voxserve.config import CacheConfig, Settings, load_settings
from voxserve.pipeline.synthesis.synthesize import synthesize
from voxserve.runtime import Runtime

HOT = [
    "Thank you for calling. How can I help you today?",
    "Our opening hours are nine to five, Monday to Friday.",
    "Please hold while I transfer your call.",
    "Sorry, I did not catch that. Could you say it again?",
    "Your order has been shipped and will arrive tomorrow.",
    "Is there anything else I can help you with?",
    "Goodbye, and have a nice day.",
    "Your balance is forty two dollars and ten cents.",
]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def ms(values: list[float]) -> str:
    return (
        f"P50 {pct(values, 50) * 1000:.3f} ms, P99 {pct(values, 99) * 1000:.3f} ms, "
        f"max {max(values) * 1000:.3f} ms (n={len(values)})"
    )


def settings_with(cache_dir: Path, *, enabled: bool = True) -> Settings:
    settings = load_settings(log_level="warning")
    cache = CacheConfig(dir=cache_dir, enabled=enabled)
    degrade = settings.tts.degrade.model_copy(update={"enabled": False})  # measure, not shed
    tts = settings.tts.model_copy(update={"degrade": degrade})
    return settings.model_copy(update={"cache": cache, "tts": tts})


async def timed(runtime: Runtime, text: str) -> tuple[float, float, int]:
    """(seconds to first chunk, seconds to last, chunks)."""
    started = time.perf_counter()
    first = 0.0
    chunks = 0
    async for _ in synthesize(runtime, text):
        if not chunks:
            first = time.perf_counter() - started
        chunks += 1
    return first, time.perf_counter() - started, chunks


async def hit_latency(runtime: Runtime, n: int) -> None:
    for text in HOT:
        await timed(runtime, text)  # misses: now cached
    firsts: list[float] = []
    wholes: list[float] = []
    chunks = 0
    for i in range(n):
        first, whole, chunks = await timed(runtime, HOT[i % len(HOT)])
        firsts.append(first)
        wholes.append(whole)
    assert runtime.cache is not None
    stats = runtime.cache.stats()
    print(f"hits: {stats.hits}, misses: {stats.misses}, hit ratio {stats.hit_ratio}")
    print(f"hit, first chunk:  {ms(firsts)}")
    print(f"hit, whole reply:  {ms(wholes)}  ({chunks} chunks of <= 200 ms)")


async def miss_latency(cached: Runtime, plain: Runtime, n: int) -> None:
    rng = random.Random(5)
    results: dict[str, tuple[list[float], list[float]]] = {"cache": ([], []), "none": ([], [])}
    for i in range(n):
        text = f"{rng.choice(HOT)} Reference {i} {rng.randint(0, 10**6)}."
        order = [("cache", cached), ("none", plain)]
        if i % 2:
            order.reverse()
        for name, runtime in order:
            first, whole, _ = await timed(runtime, text)
            results[name][0].append(first)
            results[name][1].append(whole)
    for name, (firsts, wholes) in results.items():
        print(
            f"miss, cache {'on ' if name == 'cache' else 'off'}: first audio median "
            f"{statistics.median(firsts) * 1000:.1f} ms (P90 {pct(firsts, 90) * 1000:.1f}), "
            f"whole median {statistics.median(wholes) * 1000:.1f} ms (n={len(firsts)})"
        )


async def recovery(megabytes: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        store = SqliteStore(Path(directory) / "tts-cache.sqlite3")
        rng = random.Random(1)
        entry_bytes = 96_000  # 3 s of 16 kHz audio
        count = megabytes * 1024 * 1024 // entry_bytes
        now = time.time()
        batch: list[Put] = []
        for i in range(count):
            pcm = rng.randbytes(entry_bytes)
            entry = Entry(f"{i:064x}", "joe", f"sentence {i}", 16000, pcm, now, now + 3600)
            batch.append(Put(entry, now + i))
            if len(batch) == 64 or i == count - 1:
                store.apply(batch)
                batch.clear()
        store.close()
        config = CacheConfig(dir=Path(directory), max_bytes=(megabytes + 1) * 1024 * 1024)
        cache = TtsCache(config)
        started = time.perf_counter()
        report = await cache.load()
        took = time.perf_counter() - started
        print(
            f"recovery: {len(report.entries)} entries, {report.loaded_bytes / 2**20:.0f} MB "
            f"read back and checked in {took:.2f} s ({report.loaded_bytes / 2**20 / took:.0f} "
            "MB/s; file in the page cache)"
        )
        await cache.aclose()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hit_buckets(metrics: str) -> str:
    """The server's own first-audio histogram for hits: share under 1 ms and 5 ms."""
    counts: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith('voxserve_tts_first_audio_seconds_bucket{le="') and "hit" in line:
            le = line.split('le="')[1].split('"')[0]
            counts[le] = float(line.rsplit(" ", 1)[1])
    total = counts.get("+Inf", 0.0) or 1.0
    return (
        f"{counts.get('0.001', 0) / total:.2%} under 1 ms, "
        f"{counts.get('0.005', 0) / total:.2%} under 5 ms (n={total:.0f})"
    )


def http_hits(n: int, concurrency: int, fmt: str = "pcm") -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXSERVE_")}
    env |= {"VOXSERVE_GRPC_PORT": "0", "VOXSERVE_WYOMING_PORT": "0"}
    with tempfile.TemporaryDirectory() as directory:
        command = [sys.executable, "-m", "voxserve", "serve", "--port", str(port)]
        command += ["--cache-dir", directory, "--log-level", "warning"]
        server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
        try:
            asyncio.run(drive_hits(f"http://127.0.0.1:{port}", server.pid, n, concurrency, fmt))
        finally:
            server.terminate()
            server.wait(timeout=15)


async def drive_hits(base: str, pid: int, n: int, concurrency: int, fmt: str) -> None:
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as http:
        while True:
            try:
                if (await http.get("/readyz")).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)

        async def speak(text: str) -> int:
            body = {"input": text, "response_format": fmt, "sample_rate": 16000}
            response = await http.post("/v1/audio/speech", json=body)
            assert response.status_code == 200, response.text
            return len(response.content)

        for text in HOT:  # misses: now cached (a busy machine may refuse a miss for a while)
            body = {"input": text, "response_format": fmt, "sample_rate": 16000}
            for _ in range(60):
                if (await http.post("/v1/audio/speech", json=body)).status_code != 503:
                    break
                await asyncio.sleep(1.0)
        queue = list(range(n))

        async def worker() -> int:
            got = 0
            while queue:
                got += await speak(HOT[queue.pop() % len(HOT)])
            return got

        cpu_before, started = cpu_seconds(pid), time.perf_counter()
        sizes = await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu_before
        metrics = (await http.get("/metrics")).text
    print(
        f"http hits: {n} requests ({sum(sizes) / n / 1000:.0f} KB of {fmt} each), concurrency "
        f"{concurrency}: {n / wall:.0f} req/s on the wall clock (client on the same 2 cores), "
        f"server CPU {cpu:.2f} s -> {n / cpu:.0f} hits per server-CPU-second (per core)"
    )
    print(f"server-side first audio of hits: {hit_buckets(metrics)}")


async def in_process(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        cached = Runtime(settings_with(Path(a)))
        plain = Runtime(settings_with(Path(b), enabled=False))
        await cached.load()
        await plain.load()
        try:
            await hit_latency(cached, args.hits)
            await miss_latency(cached, plain, args.misses)
        finally:
            await cached.aclose()
            await plain.aclose()
    await recovery(args.recovery_mb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hits", type=int, default=20_000)
    parser.add_argument("--misses", type=int, default=12)
    parser.add_argument("--recovery-mb", type=int, default=100)
    parser.add_argument("--http", type=int, default=3000, help="HTTP hits (0: skip)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--format", default="pcm", help="response_format of the HTTP hits")
    parser.add_argument("--http-only", action="store_true", help="only the HTTP hits")
    args = parser.parse_args()
    if not args.http_only:
        asyncio.run(in_process(args))
    if args.http:
        http_hits(args.http, args.concurrency, args.format)


if __name__ == "__main__":
    main()

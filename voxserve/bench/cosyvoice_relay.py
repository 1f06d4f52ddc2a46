"""`python -m voxserve.bench.cosyvoice_relay`: what voxserve adds in front of a CosyVoice
runtime. The same requests go to a stand-in of CosyVoice's gRPC runtime
(standins/cosyvoice.py: tones, no model, so the runtime's own time is ~0) directly, and
through a spawned `voxserve serve` whose TTS engine is `cosyvoice` pointing at it
(/v1/audio/speech, pcm, cache off); it prints time to first audio and to the last byte,
percentiles of each, and the difference: voxserve's relay cost, apart from any model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from voxserve.bench.servers import http_base, spawn_voxserve
from voxserve.bench.stats import percentile
from voxserve.standins.cosyvoice import GrpcStandin, sft_client

Timing = tuple[float, float]  # (first audio, last byte), seconds


def direct(target: str) -> Callable[[str], Timing]:
    speak = sft_client(target)

    def one(text: str) -> Timing:
        started = time.perf_counter()
        first = 0.0
        for _ in speak(text):
            first = first or time.perf_counter() - started
        return first, time.perf_counter() - started

    return one


def relayed(base_url: str, concurrency: int) -> Callable[[str], Timing]:
    client = httpx.Client(
        base_url=base_url, timeout=30, limits=httpx.Limits(max_connections=concurrency)
    )

    def one(text: str) -> Timing:
        body = {"model": "tts-1", "voice": "woman", "input": text, "response_format": "pcm"}
        started = time.perf_counter()
        first = 0.0
        with client.stream("POST", "/v1/audio/speech", json=body) as response:
            response.raise_for_status()
            for chunk in response.iter_raw():
                if chunk:
                    first = first or time.perf_counter() - started
        return first, time.perf_counter() - started

    return one


def run(call: Callable[[str], Timing], requests: int, concurrency: int) -> list[Timing]:
    texts = [f"Sentence number {i} of this run." for i in range(requests)]  # no cache hits
    call("Warm up.")
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(call, texts))


def summary(timings: list[Timing]) -> dict[str, float]:
    out: dict[str, float] = {}
    for index, name in ((0, "first"), (1, "last")):
        values = sorted(t[index] * 1000 for t in timings)
        for p in (50, 90, 99):
            out[f"{name}_p{p}_ms"] = round(percentile(values, p), 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m voxserve.bench.cosyvoice_relay")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--chunks", type=int, default=3, help="stand-in chunks per reply")
    args = parser.parse_args(argv)
    standin = GrpcStandin(chunks=args.chunks).start()
    url = f"grpc://127.0.0.1:{standin.port}"
    top = max(args.concurrency)
    env = {
        "VOXSERVE_ENGINES__TTS": json.dumps(
            [{"name": "cosyvoice", "options": {"url": url, "voices": {"woman": "中文女"}}}]
        ),
        "VOXSERVE_ENGINES__ASR": json.dumps({"name": "load"}),  # neither is measured
        "VOXSERVE_ENGINES__VAD": json.dumps({"name": "load"}),
        "VOXSERVE_ENGINES__DEFAULT_VOICE": "woman",
        "VOXSERVE_CACHE__ENABLED": "false",
        "VOXSERVE_TTS__DEGRADE__ENABLED": "false",
        "VOXSERVE_PIPELINE__TTS": json.dumps({"concurrency": top, "timeout_s": 15}),
    }
    results: list[dict[str, Any]] = []
    try:
        log = Path(tempfile.mkdtemp(prefix="cosyvoice-relay-")) / "voxserve.log"
        with spawn_voxserve(log, env=env) as server:
            base = http_base(server.url)
            for concurrency in args.concurrency:
                for name, call in (
                    ("direct", direct(f"127.0.0.1:{standin.port}")),
                    ("voxserve", relayed(base, concurrency)),
                ):
                    timings = run(call, args.requests, concurrency)
                    row = {"path": name, "concurrency": concurrency, **summary(timings)}
                    results.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        standin.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""HTTP speech load: POST /v1/audio/speech at a target rate (open loop: requests go out on
schedule whether or not earlier ones finished), with a mix of hot sentences (a few, asked
again and again) and cold ones (each asked once), timing every response's audio."""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass

import httpx

from voxserve.bench.loadgen import watch
from voxserve.bench.records import Raw
from voxserve.bench.schedule import arrivals
from voxserve.bench.stats import percentile, underrun

PCM_RATE = 16_000


@dataclass(frozen=True)
class SpeechSpec:
    base_url: str  # http://HOST:PORT
    rate: float  # requests per second from this process
    duration_s: float
    hot_texts: tuple[str, ...]
    cold_texts: tuple[str, ...]
    hot_fraction: float = 0.5
    voice: str | None = None
    poisson: bool = True
    seed: int = 0
    max_inflight: int = 256
    drain_s: float = 30.0
    ramp_s: float = 0.0


def pick_text(spec: SpeechSpec, i: int, rng: random.Random) -> tuple[str, bool]:
    """(text, hot?): hot texts repeat; a cold text is made unique by its request number."""
    if spec.hot_texts and rng.random() < spec.hot_fraction:
        return rng.choice(spec.hot_texts), True
    base = spec.cold_texts[i % len(spec.cold_texts)] if spec.cold_texts else "Hello."
    return f"{base} Request {spec.seed}-{i}.", False


async def one_request(
    client: httpx.AsyncClient, spec: SpeechSpec, text: str, hot: bool, raw: Raw
) -> None:
    body = {"model": "tts-1", "input": text, "response_format": "pcm", "sample_rate": PCM_RATE}
    if spec.voice:
        body["voice"] = spec.voice
    sent = time.monotonic()
    arrived: list[float] = []
    durations: list[float] = []
    try:
        async with client.stream("POST", f"{spec.base_url}/v1/audio/speech", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                code = _error_code(resp)
                raw.errors[f"http_{resp.status_code}:{code}"] += 1
                raw.failed_streams += 1
                return
            async for data in resp.aiter_raw():
                arrived.append(time.monotonic())
                durations.append(len(data) / 2 / PCM_RATE)
    except httpx.HTTPError as exc:
        raw.errors[f"http:{type(exc).__name__}"] += 1
        raw.failed_streams += 1
        return
    raw.counts["requests_ok"] += 1
    if not arrived:
        raw.counts["empty_responses"] += 1
        return
    first = arrived[0] - sent
    raw.add("first_audio", first)
    raw.add("first_audio_hot" if hot else "first_audio_cold", first)
    raw.add("request", arrived[-1] - sent)
    raw.add("underrun", underrun(arrived, durations).starved_s)
    raw.counts["audio_ms"] += round(sum(durations) * 1000)


def _error_code(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "unknown"


async def drive(spec: SpeechSpec, start_at: float) -> Raw:
    raw = Raw()
    end_at = start_at + spec.duration_s
    watcher = asyncio.create_task(watch(raw, start_at, end_at))
    rng = random.Random(spec.seed)
    limits = httpx.Limits(max_connections=spec.max_inflight, max_keepalive_connections=64)
    timeout = httpx.Timeout(spec.drain_s, connect=10.0)
    pending: set[asyncio.Task[None]] = set()
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        for i, at in enumerate(
            arrivals(spec.rate, spec.duration_s, poisson=spec.poisson, seed=spec.seed)
        ):
            due = start_at + at
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            raw.lateness.append(time.monotonic() - due)
            raw.counts["requests"] += 1
            if len(pending) >= spec.max_inflight:
                raw.errors["client_inflight_limit"] += 1
                raw.failed_streams += 1
                continue
            text, hot = pick_text(spec, i, rng)
            raw.counts["requests_hot" if hot else "requests_cold"] += 1
            task = asyncio.create_task(one_request(client, spec, text, hot, raw))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            _, late = await asyncio.wait(
                pending, timeout=max(0.0, end_at + spec.drain_s - time.monotonic())
            )
            for task in late:
                task.cancel()
                raw.errors["drain_timeout"] += 1
                raw.failed_streams += 1
            await asyncio.gather(*late, return_exceptions=True)
    cpu_s, wall_s = await watcher
    raw.procs.append(
        {
            "pid": os.getpid(),
            "rate": spec.rate,
            "cpu_percent": round(100 * cpu_s / wall_s, 1) if wall_s else None,
            "lateness_p99_ms": round(percentile(raw.lateness, 99) * 1000, 3)
            if raw.lateness
            else None,
        }
    )
    return raw


def run(spec: SpeechSpec, start_at: float) -> Raw:
    """Process entry point (picklable)."""
    return asyncio.run(drive(spec, start_at))

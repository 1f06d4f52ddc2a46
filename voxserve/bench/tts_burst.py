"""TTS under bursts and overload, with the clients users have: the `wyoming` package's
client (`synthesize`: any Wyoming TTS server, voxserve or wyoming-piper, the same run) and
HTTP /v1/audio/speech.

- `tts-burst`: N concurrent Wyoming `synthesize` requests (one connection each), rounds
  back to back: served/refused, first audio P50/P99 (client side: request sent -> first
  audio-chunk), audio seconds per wall second.
- `tts-steps`: HTTP speech at a rate that steps up to a multiple of the measured capacity
  (open loop): per step goodput (audio seconds of admitted requests per wall second, over
  the step and its drain), admitted first-audio P99, refusals and how fast they came, and
  whether each refusal had Retry-After.

Both report how the admitted streams played: a client that plays each stream from its first
audio at real time starves whenever a chunk comes after everything before it has played
(`stats.underrun`); `paused` counts the served streams that starved longer than PAUSE_S at
least once, `pause_p99_s` is the P99 of each stream's longest starvation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxserve.bench.servers import http_base
from voxserve.bench.stats import percentile, underrun

if TYPE_CHECKING:  # imported where used: `voxserve bench --help` builds this module's parsers
    import httpx

TEXTS = (
    "The quick brown fox jumps over the lazy dog. Then it runs into the forest.",
    "Good morning, the weather today is mild. Expect light rain after noon.",
    "Your package has shipped this afternoon. It should arrive on Friday.",
    "The meeting moved to three o'clock. Please bring the quarterly report.",
    "Turn left at the next corner. The station is on your right.",
    "Dinner is ready in ten minutes. Could you set the table, please?",
    "The train to Boston is delayed. A new time will be announced shortly.",
    "Thanks for calling our help line. An agent will be with you soon.",
)
PCM_RATE = 16_000
# A starvation a listener hears as a pause (a stream's longest, counted); the server's
# admission learns from the same gap (tts_lateness.STARVED_S: the bench reaches the server
# only over the wire, so it is stated twice).
PAUSE_S = 0.1


@dataclass
class Result:
    ok: bool
    code: str = ""  # the error code of a refusal or failure
    first_audio_s: float | None = None  # request sent -> first audio
    total_s: float = 0.0  # request sent -> answer complete (or refused)
    audio_s: float = 0.0  # audio received
    retry_after: str | None = None  # HTTP Retry-After of a refusal
    arrivals: list[float] = field(default_factory=list)  # when each piece of audio came
    durations: list[float] = field(default_factory=list)  # and how long it plays

    def heard(self, seconds: float) -> None:
        """A piece of `seconds` of audio arrived now."""
        self.arrivals.append(time.monotonic())
        self.durations.append(seconds)
        self.audio_s += seconds

    @property
    def longest_pause_s(self) -> float:
        """The longest a real-time player of this stream starved after its first audio."""
        return underrun(self.arrivals, self.durations).longest_s


async def wyoming_request(host: str, port: int, text: str, voice: str | None) -> Result:
    """One `synthesize` on its own connection, timed from the request."""
    from wyoming.audio import AudioChunk
    from wyoming.client import AsyncTcpClient
    from wyoming.error import Error
    from wyoming.tts import Synthesize, SynthesizeVoice

    result = Result(ok=False)
    async with AsyncTcpClient(host, port) as client:
        sent = time.monotonic()
        named = SynthesizeVoice(name=voice) if voice else None
        await client.write_event(Synthesize(text=text, voice=named).event())
        while True:
            event = await client.read_event()
            if event is None:
                result.code = "closed"
                break
            if AudioChunk.is_type(event.type):
                chunk = AudioChunk.from_event(event)
                if result.first_audio_s is None:
                    result.first_audio_s = time.monotonic() - sent
                result.heard(len(chunk.audio) / (chunk.width * chunk.channels * chunk.rate))
            elif event.type == "audio-stop":
                result.ok = True
                break
            elif Error.is_type(event.type):
                result.code = Error.from_event(event).code or "error"
                break
        result.total_s = time.monotonic() - sent
    return result


async def wyoming_burst(
    host: str, port: int, concurrency: int, rounds: int, voice: str | None = None, offset: int = 0
) -> tuple[list[Result], float]:
    """`rounds` bursts of `concurrency` requests, each round once the last is done; the
    results and the wall time of all rounds."""
    results: list[Result] = []
    started = time.monotonic()
    for r in range(rounds):
        texts = [TEXTS[(offset + r * concurrency + i) % len(TEXTS)] for i in range(concurrency)]
        results += await asyncio.gather(*(wyoming_request(host, port, t, voice) for t in texts))
    return results, time.monotonic() - started


async def http_request(
    client: httpx.AsyncClient, base_url: str, text: str, voice: str | None
) -> Result:
    """One POST /v1/audio/speech (raw PCM), timed from the request."""
    body: dict[str, Any] = {"model": "tts-1", "input": text, "response_format": "pcm"}
    body["sample_rate"] = PCM_RATE
    if voice:
        body["voice"] = voice
    result = Result(ok=False)
    sent = time.monotonic()
    async with client.stream("POST", f"{base_url}/v1/audio/speech", json=body) as resp:
        if resp.status_code != 200:
            payload = await resp.aread()
            result.retry_after = resp.headers.get("retry-after")
            try:
                result.code = json.loads(payload)["error"]["code"]
            except (ValueError, KeyError, TypeError):
                result.code = str(resp.status_code)
        else:
            async for data in resp.aiter_bytes():
                if not data:
                    continue
                if result.first_audio_s is None:
                    result.first_audio_s = time.monotonic() - sent
                result.heard(len(data) / 2 / PCM_RATE)
            result.ok = True
    result.total_s = time.monotonic() - sent
    return result


async def http_burst(
    base_url: str, concurrency: int, voice: str | None = None, offset: int = 0
) -> list[Result]:
    import httpx

    limits = httpx.Limits(max_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as client:
        texts = [TEXTS[(offset + i) % len(TEXTS)] for i in range(concurrency)]
        return list(
            await asyncio.gather(*(http_request(client, base_url, t, voice) for t in texts))
        )


async def http_capacity(
    base_url: str, concurrency: int, seconds: float, voice: str | None = None
) -> tuple[float, float]:
    """Closed loop, `concurrency` clients back to back for `seconds`: (requests per second,
    audio seconds per second) served, refusals excluded (there should be none)."""
    import httpx

    done: list[Result] = []
    limits = httpx.Limits(max_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as client:
        end = time.monotonic() + seconds
        started = time.monotonic()

        async def loop(k: int) -> None:
            i = k
            while time.monotonic() < end:
                result = await http_request(client, base_url, TEXTS[i % len(TEXTS)], voice)
                if result.ok:
                    done.append(result)
                i += concurrency

        await asyncio.gather(*(loop(k) for k in range(concurrency)))
        wall = time.monotonic() - started
    return len(done) / wall, sum(r.audio_s for r in done) / wall


async def http_open_loop(
    base_url: str, rate: float, seconds: float, voice: str | None = None, offset: int = 0
) -> tuple[list[Result], float]:
    """Requests at `rate` per second for `seconds` (evenly spaced, whether or not earlier
    ones finished); the results and the wall time until the last answer."""
    import httpx

    async with httpx.AsyncClient(timeout=120.0, limits=httpx.Limits(max_connections=None)) as c:
        started = time.monotonic()
        tasks = []
        n = max(1, round(rate * seconds))
        for i in range(n):
            delay = started + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            text = TEXTS[(offset + i) % len(TEXTS)]
            tasks.append(asyncio.create_task(http_request(c, base_url, text, voice)))
        results = list(await asyncio.gather(*tasks))
        return results, time.monotonic() - started


def summary(results: Sequence[Result], wall_s: float) -> dict[str, Any]:
    """Served/refused, first audio P50/P99 of the served, audio seconds per wall second."""
    served = [r for r in results if r.ok]
    refused = [r for r in results if not r.ok]
    firsts = [r.first_audio_s for r in served if r.first_audio_s is not None]
    refusal_s = [r.total_s for r in refused]
    pauses = [r.longest_pause_s for r in served]
    return {
        "requests": len(results),
        "served": len(served),
        "refused": len(refused),
        "codes": sorted({r.code for r in refused}),
        "first_audio_p50_s": percentile(firsts, 50) if firsts else None,
        "first_audio_p99_s": percentile(firsts, 99) if firsts else None,
        "audio_s_per_wall_s": sum(r.audio_s for r in served) / wall_s if wall_s > 0 else 0.0,
        "paused": sum(1 for p in pauses if p > PAUSE_S),
        "pause_p99_s": percentile(pauses, 99) if pauses else None,
        "refusal_p99_s": percentile(refusal_s, 99) if refusal_s else None,
        "refusals_with_retry_after": sum(1 for r in refused if r.retry_after),
        "wall_s": wall_s,
    }


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def _write(out: str, name: str, rows: list[dict[str, Any]]) -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(rows, indent=2) + "\n")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def cmd_tts_burst(args: argparse.Namespace) -> int:
    host, port = _host_port(args.wyoming)
    rows = []
    for n in args.concurrency:
        results, wall = asyncio.run(wyoming_burst(host, port, n, args.rounds, args.voice))
        row = {"label": args.label, "concurrency": n, "rounds": args.rounds}
        row |= summary(results, wall)
        rows.append(row)
        print(
            f"| {args.label} | {n} | {row['served']}/{row['requests']} | {row['refused']} | "
            f"{_fmt(row['first_audio_p50_s'])} | {_fmt(row['first_audio_p99_s'])} | "
            f"{row['audio_s_per_wall_s']:.1f} | {row['paused']} | {_fmt(row['pause_p99_s'])} |",
            flush=True,
        )
    _write(args.out, f"tts-burst-{args.label}.json", rows)
    return 0


def cmd_tts_steps(args: argparse.Namespace) -> int:
    url = http_base(args.url)
    rps, audio_rate = asyncio.run(http_capacity(url, args.capacity_clients, args.step_s))
    print(f"capacity: {rps:.2f} requests/s, {audio_rate:.1f} audio-s/s (closed loop)", flush=True)
    rows: list[dict[str, Any]] = [{"capacity_rps": rps, "capacity_audio_s_per_s": audio_rate}]
    print(
        "| load | requests/s | served | goodput audio-s/s (ratio) | admitted first audio P99 s "
        "| refused | refusal P99 s | with Retry-After | paused | longest pause P99 s |\n"
        "|---|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    for k, multiple in enumerate(args.multiples):
        results, wall = asyncio.run(
            http_open_loop(url, rps * multiple, args.step_s, args.voice, offset=k)
        )
        row = {"multiple": multiple, "rate": rps * multiple} | summary(results, wall)
        row["goodput_ratio"] = row["audio_s_per_wall_s"] / audio_rate if audio_rate else None
        rows.append(row)
        print(
            f"| {multiple:g}x | {row['rate']:.2f} | {row['served']}/{row['requests']} | "
            f"{row['audio_s_per_wall_s']:.1f} ({row['goodput_ratio']:.2f}) | "
            f"{_fmt(row['first_audio_p99_s'])} | {row['refused']} | "
            f"{_fmt(row['refusal_p99_s'])} | {row['refusals_with_retry_after']} | "
            f"{row['paused']} | {_fmt(row['pause_p99_s'])} |",
            flush=True,
        )
    _write(args.out, "tts-steps.json", rows)
    return 0


def add_tts_burst_parsers(add: Any) -> None:
    """`bench tts-burst` and `bench tts-steps` (the `add` of bench/cli.py)."""
    burst = add(
        "tts-burst",
        "voxserve.bench.tts_burst:cmd_tts_burst",
        "N concurrent Wyoming synthesize requests (the wyoming package's client), rounds back "
        "to back, against any Wyoming TTS server: served/refused, first audio, audio-s/s",
    )
    burst.add_argument("--wyoming", required=True, metavar="HOST:PORT")
    burst.add_argument(
        "--concurrency", type=lambda t: [int(x) for x in t.split(",")], default=[1, 8, 16, 64]
    )
    burst.add_argument("--rounds", type=int, default=5)
    burst.add_argument("--label", default="server", help="the row's name in the table")
    steps = add(
        "tts-steps",
        "voxserve.bench.tts_burst:cmd_tts_steps",
        "HTTP speech in steps up to a multiple of the measured capacity (open loop): goodput, "
        "admitted first-audio P99, refusals (time to answer, Retry-After)",
    )
    steps.add_argument(
        "--multiples", type=lambda t: [float(x) for x in t.split(",")], default=[0.5, 1, 2, 4]
    )
    steps.add_argument("--step-s", type=float, default=5.0, help="seconds of load per step")
    steps.add_argument(
        "--capacity-clients", type=int, default=4, help="closed-loop clients measuring capacity"
    )

"""`voxserve bench wyoming`: transcript latency over Wyoming, as Home Assistant sees it.

Each request is one recording sent at real-time pace (chunks of --chunk-ms, like a
satellite's microphone), then --tail-ms of silence (what a satellite's VAD waits before
it ends the command), then `audio-stop`, through the `wyoming` package's own client. Per
request: when the first `transcript-chunk` came and when `transcript` came, from the
first audio sent and from the end of speech (the recording's last sample sent; negative:
before it), and from `audio-stop`; the WER of the final. Several servers (--target
NAME=HOST:PORT) are measured in one run, one request at a time, alternating the order
every round so neither always goes first. A server that does not stream (a peer before
Wyoming 1.7 streaming) has no chunks: its first text is its `transcript`.

`--at-once`: each recording is sent as fast as the connection takes it, as a one-shot client
(a file, a phone's recorded command) does; the figure that matters then is `transcript` from
`audio-stop`.

`--concurrency N`: N requests at once per target (a burst of N clients, the recordings taken
in turn), the targets one after another, alternating; a request the server refuses (an
`error` event: `overloaded` and the like) is counted with its code and how long the refusal
took, not measured as a transcript. What admission promises is read from the two together:
the admitted requests' `transcript` P99 and how fast the rest were told no. With
`--budget-ms B --budget-per-audio F` (voxserve's `asr.one_shot_budget_ms` and
`asr.one_shot_budget_per_audio`), each admitted request's `transcript` after `audio-stop` is
also judged against B + F x its audio seconds: `late` counts those past it, for every target
alike (the peer is held to the same promise).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxserve.bench.report import eprint
from voxserve.types import SAMPLE_RATE

if TYPE_CHECKING:
    from voxserve.bench.program import Pcm

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
READ_TIMEOUT_S = 60.0


@dataclass
class Refusal:
    """A request the server answered with an `error` event."""

    target: str
    clip: int
    code: str
    after_s: float  # from the first audio sent


@dataclass
class Request:
    target: str
    clip: int
    chunks: int
    first_chunk_s: float | None  # from the first audio sent
    first_chunk_after_speech_s: float | None  # from the end of speech (negative: before)
    final_s: float  # `transcript`, from the first audio sent
    final_after_speech_s: float
    final_after_stop_s: float  # from `audio-stop`
    joined: bool  # the chunks joined equal the final (True when there were none)
    text: str
    reference: str
    audio_s: float = 0.0  # the recording's length (its tail of silence included)


async def one_request(
    name: str, host: str, port: int, clip: int, pcm: Pcm, text: str, args: argparse.Namespace
) -> Request | Refusal:
    import numpy as np
    from wyoming.asr import Transcribe, Transcript, TranscriptChunk
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient

    rate, step = SAMPLE_RATE, SAMPLE_RATE * args.chunk_ms // 1000
    tail = np.zeros(SAMPLE_RATE * args.tail_ms // 1000, dtype=np.int16)
    audio = np.concatenate([pcm, tail])
    marks: dict[str, float] = {}
    chunks: list[tuple[float, str]] = []

    async def send(client: AsyncTcpClient) -> None:
        await client.write_event(Transcribe(language=args.language).event())
        await client.write_event(AudioStart(rate=rate, width=2, channels=1).event())
        began = marks["start"] = time.perf_counter()
        for n, at in enumerate(range(0, audio.size, step)):
            piece = audio[at : at + step].astype("<i2").tobytes()
            chunk = AudioChunk(rate=rate, width=2, channels=1, audio=piece)
            await client.write_event(chunk.event())
            if at + step >= pcm.size and "speech_end" not in marks:
                marks["speech_end"] = time.perf_counter()  # the recording's last sample
            if not args.at_once:
                await asyncio.sleep(max(0.0, began + (n + 1) * step / rate - time.perf_counter()))
        await client.write_event(AudioStop().event())
        marks["stop"] = time.perf_counter()

    async with AsyncTcpClient(host, port, read_timeout=READ_TIMEOUT_S) as client:
        sender = asyncio.create_task(send(client))
        while True:
            event = await client.read_event()
            if event is None:
                raise RuntimeError(f"{name}: connection closed before the transcript")
            now = time.perf_counter()
            if TranscriptChunk.is_type(event.type):
                chunks.append((now, TranscriptChunk.from_event(event).text))
            elif Transcript.is_type(event.type):
                final = Transcript.from_event(event).text
                marks["final"] = now
                break
            elif event.type == "error":
                data = event.data or {}
                sender.cancel()
                code = str(data.get("code") or data.get("text"))
                return Refusal(name, clip, code, now - marks["start"])
        await sender
    start, speech_end = marks["start"], marks["speech_end"]
    first = chunks[0][0] if chunks else None
    return Request(
        target=name,
        clip=clip,
        chunks=len(chunks),
        first_chunk_s=None if first is None else first - start,
        first_chunk_after_speech_s=None if first is None else first - speech_end,
        final_s=marks["final"] - start,
        final_after_speech_s=marks["final"] - speech_end,
        final_after_stop_s=marks["final"] - marks["stop"],
        joined=not chunks or "".join(t for _, t in chunks) == final,
        text=final,
        reference=text,
        audio_s=audio.size / rate,
    )


def _target(text: str) -> tuple[str, str, int]:
    name, _, where = text.rpartition("=")
    host, _, port = where.removeprefix("tcp://").rpartition(":")
    if not name or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=HOST:PORT, got {text!r}")
    return name, host, int(port)


def add_wyoming_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        type=_target,
        action="append",
        required=True,
        metavar="NAME=HOST:PORT",
        help="a Wyoming server to measure (repeatable: measured side by side)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="passes over the recordings")
    parser.add_argument("--chunk-ms", type=int, default=20, help="audio per audio-chunk")
    parser.add_argument(
        "--tail-ms", type=int, default=500, help="silence after the speech, before audio-stop"
    )
    parser.add_argument(
        "--at-once",
        action="store_true",
        help="send each recording as fast as the connection takes it (a one-shot client)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="requests at once per target (a burst); refusals are counted, not measured",
    )
    parser.add_argument(
        "--budget-ms",
        type=float,
        default=None,
        help="judge each transcript against this plus --budget-per-audio x its audio (late)",
    )
    parser.add_argument("--budget-per-audio", type=float, default=0.0)
    parser.add_argument("--language", default="en")
    parser.add_argument(
        "--audio-dir", type=Path, default=FIXTURES, help="WAVs and their fixtures.json"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results/wyoming"))


METRICS = (
    "first_chunk_s",
    "first_chunk_after_speech_s",
    "final_s",
    "final_after_speech_s",
    "final_after_stop_s",
)


def late(requests: list[Request], budget_ms: float | None, per_audio: float) -> int | None:
    """Admitted requests whose transcript came past budget_ms + per_audio x their audio."""
    if budget_ms is None:
        return None
    return sum(r.final_after_stop_s > budget_ms / 1000 + per_audio * r.audio_s for r in requests)


def summary(
    requests: list[Request],
    names: list[str],
    refusals: list[Refusal] | None = None,
    budget: tuple[float | None, float] = (None, 0.0),
) -> dict[str, Any]:
    from voxserve.bench.stats import summarize, wer

    out: dict[str, Any] = {}
    for name in names:
        mine = [r for r in requests if r.target == name]
        refused = [r for r in refusals or () if r.target == name]
        row: dict[str, Any] = {"requests": len(mine) + len(refused), "refused": len(refused)}
        for metric in METRICS:
            values = [v for r in mine if (v := getattr(r, metric)) is not None]
            row[metric] = summarize(values)
        row["refused_after_s"] = summarize([r.after_s for r in refused])
        row["refused_codes"] = sorted({r.code for r in refused})
        row["late"] = late(mine, *budget)
        row["chunks_per_request"] = sum(r.chunks for r in mine) / max(1, len(mine))
        row["chunks_join_to_final"] = all(r.joined for r in mine)
        row["wer"] = wer((r.reference, r.text) for r in mine) if mine else None
        out[name] = row
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| target | requests | refused | chunks/req | first chunk from audio start P50 / P90 ms "
        "| first chunk from end of speech P50 / P90 ms | transcript from end of speech "
        "P50 / P90 ms | transcript from audio-stop P50 / P99 ms | late | refusal after P50 ms "
        "| WER |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ms(row: dict[str, Any], metric: str, *quantiles: str) -> str:
        s = row[metric]
        return "-" if s["p50"] is None else " / ".join(f"{s[q]:.0f}" for q in quantiles)

    for name, row in result.items():
        wer = "-" if row["wer"] is None else f"{row['wer']:.3f}"
        lines.append(
            f"| {name} | {row['requests']} | {row['refused']} | {row['chunks_per_request']:.1f} "
            f"| {ms(row, 'first_chunk_s', 'p50', 'p90')} "
            f"| {ms(row, 'first_chunk_after_speech_s', 'p50', 'p90')} "
            f"| {ms(row, 'final_after_speech_s', 'p50', 'p90')} "
            f"| {ms(row, 'final_after_stop_s', 'p50', 'p99')} "
            f"| {'-' if row['late'] is None else row['late']} "
            f"| {ms(row, 'refused_after_s', 'p50')} | {wer} |"
        )
    return "\n".join(lines) + "\n"


def cmd_wyoming(args: argparse.Namespace) -> int:
    from voxserve.bench.program import fixture_clips

    clips = fixture_clips(args.audio_dir)
    names = [name for name, _, _ in args.target]
    requests: list[Request] = []
    refusals: list[Refusal] = []

    def record(outcome: Request | Refusal) -> None:
        if isinstance(outcome, Refusal):
            refusals.append(outcome)
        else:
            requests.append(outcome)

    async def burst(name: str, host: str, port: int, first: int) -> None:
        picks = [(first + i) % len(clips) for i in range(args.concurrency)]
        for outcome in await asyncio.gather(
            *(one_request(name, host, port, c, *clips[c], args) for c in picks)
        ):
            record(outcome)

    async def run() -> None:
        for r in range(args.rounds):
            order = args.target if r % 2 == 0 else args.target[::-1]
            if args.concurrency > 1:
                for name, host, port in order:
                    await burst(name, host, port, r * args.concurrency)
                continue
            for clip, (pcm, text) in enumerate(clips):
                for name, host, port in order:
                    record(await one_request(name, host, port, clip, pcm, text, args))

    asyncio.run(run())
    result = summary(requests, names, refusals, (args.budget_ms, args.budget_per_audio))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(result, indent=2))
    with (args.out / "requests.jsonl").open("w") as f:
        for line in [*map(asdict, requests), *map(asdict, refusals)]:
            f.write(json.dumps(line) + "\n")
    table = markdown(result)
    (args.out / "summary.md").write_text(table)
    eprint(f"bench: wrote {args.out / 'summary.json'}")
    print(table)
    return 0

"""argparse for `voxserve bench`: `add_bench_parser(subparsers)` adds the command with its
sub-commands to the main CLI, `run_bench(args)` runs one. Heavy imports wait for the run."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Any

from voxserve.bench.report import eprint


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("expected positive integers")
    return values


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError("expected a share in [0, 1)")
    return value


def _env_item(text: str) -> str:
    if "=" not in text or text.startswith("="):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return text


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("target and output")
    g.add_argument(
        "--url",
        default="ws://127.0.0.1:8000",
        help="server to load (default %(default)s); only this host is contacted",
    )
    g.add_argument(
        "--out",
        default="bench-results",
        metavar="DIR",
        help="summary.json, steps.jsonl, summary.md and PNG charts go here",
    )
    g.add_argument(
        "--spawn",
        action="store_true",
        help="start a voxserve server of our own on a free loopback port (ignores --url)",
    )
    g.add_argument(
        "--server-config",
        metavar="FILE",
        help="config file for --spawn (e.g. bench/load-engines.toml) and for standalone figures",
    )
    g.add_argument(
        "--server-env",
        action="append",
        type=_env_item,
        default=[],
        metavar="KEY=VALUE",
        help="env var for the spawned server (repeatable), e.g. "
        'VOXSERVE_ENGINES__VAD=\'{"name":"silero"}\'',
    )
    g.add_argument(
        "--server-pid", type=int, help="server process to sample (default: found by the URL's port)"
    )
    g.add_argument(
        "--procs",
        type=int,
        default=1,
        help="load processes (default 1; 0 = run the load in this process)",
    )
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--drain",
        type=float,
        default=15.0,
        help="seconds to wait for the last results after the load stops",
    )
    g.add_argument("--quiet", action="store_true", help="no progress line")
    g.add_argument("--voice", help="TTS voice (default: the server's)")
    g.add_argument(
        "--api-key",
        metavar="KEY",
        help="sent as Authorization: Bearer KEY on every stream (a server with api_keys)",
    )
    return p


def _turn_detections(value: str) -> list[dict[str, Any]]:
    """ "semantic_vad:high,server_vad:500" -> session.start turn_detection objects."""
    out: list[dict[str, Any]] = []
    for item in value.split(","):
        kind, _, setting = item.strip().partition(":")
        if kind == "semantic_vad":
            out.append({"type": kind, "eagerness": setting or "auto"})
        elif kind == "server_vad":
            out.append({"type": kind, **({"silence_duration_ms": int(setting)} if setting else {})})
        else:
            raise argparse.ArgumentTypeError(
                f"{item!r}: use semantic_vad:low|medium|high|auto or server_vad[:ms]"
            )
    return out


def _streams() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("streams")
    g.add_argument(
        "--streams", type=int, default=10, help="concurrent streams (default %(default)s)"
    )
    g.add_argument(
        "--duration",
        type=float,
        default=20.0,
        help="seconds every stream is connected, after the ramp (default %(default)s)",
    )
    g.add_argument(
        "--mode",
        choices=["asr", "assistant", "tts", "realtime", "webrtc"],
        default="asr",
        help="realtime: assistant streams through the OpenAI Realtime API (/v1/realtime); "
        "webrtc: the same as WebRTC calls (POST /v1/realtime/calls, Opus over UDP; needs "
        "the webrtc extra)",
    )
    g.add_argument(
        "--ramp",
        type=float,
        help="spread stream starts over this many seconds (default min(5, duration/4))",
    )
    g.add_argument(
        "--source",
        choices=["fixtures", "tts", "silence"],
        default="fixtures",
        help="audio: WAVs with known text, the server's own TTS (closed loop), or quiet noise",
    )
    g.add_argument(
        "--audio-dir",
        help="WAVs + fixtures.json for --source fixtures, comma-separated directories "
        "(default tests/fixtures; assistant, realtime and webrtc modes add tests/fixtures/turns, "
        "sentences with mid-sentence pauses and lists)",
    )
    g.add_argument(
        "--turn-detection",
        type=_turn_detections,
        help="session.start turn_detection, e.g. semantic_vad:auto or server_vad:500; several, "
        "comma-separated (stream command): one step each, the turn trade-off (turns.png)",
    )
    g.add_argument(
        "--gap", type=float, help="silence after each recording, s (default 1; 3 in assistant mode)"
    )
    g.add_argument("--mark-every", type=float, default=0.5, help="seconds between marks per stream")
    g.add_argument(
        "--reply-cache",
        choices=["off", "on"],
        default="off",
        help="--spawn with replies (assistant, realtime, webrtc): the spawned server's TTS "
        "cache. off (default): every reply is synthesised, so a turn includes its first "
        "chunk's synthesis, as a new sentence's does; on: the bench's replies repeat, and "
        "after the first cycle they come from the cache (the turn figure before 2026-12-05)",
    )
    g.add_argument(
        "--sentences-per-text",
        type=int,
        default=1,
        help="tts mode: sentences in each text message (default 1; 3 gives replies a tail)",
    )
    g.add_argument(
        "--hangover-ms",
        type=int,
        default=500,
        help="the server's vad.hangover_ms, subtracted for final_minus_hangover",
    )
    g.add_argument(
        "--chunk-ms", type=int, help="session.start chunk_ms (partial re-decode interval)"
    )
    g.add_argument(
        "--partials",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="session.start partials",
    )
    g.add_argument(
        "--deflate",
        action="store_true",
        help="offer permessage-deflate (off: audio does not compress)",
    )
    g.add_argument("--cooldown", type=float, default=2.0, help="pause between steps, s")
    g.add_argument(
        "--sample-rate",
        type=int,
        choices=[8000, 16000, 22050, 24000, 48000],
        help="/v1/stream audio rate, in (session.start sample_rate) and out "
        "(output_sample_rate); default the server's 16000 (`bench realtime`: 24000, as Realtime)",
    )
    r = p.add_argument_group(
        "OpenAI Realtime streams (--mode realtime, --mode webrtc, bench realtime)"
    )
    r.add_argument(
        "--model", default="gpt-realtime", help="?model= of /v1/realtime (default %(default)s)"
    )
    r.add_argument(
        "--piece-ms",
        type=int,
        choices=[20, 40],
        default=20,
        help="audio per input_audio_buffer.append (default %(default)s, as /v1/stream's frames)",
    )
    r.add_argument(
        "--loss",
        type=_fraction,
        default=0.0,
        help="webrtc: share of each caller's outgoing audio RTP packets dropped (simulated "
        "network loss, seeded by --seed; default 0)",
    )
    r.add_argument(
        "--transcription-model",
        default="whisper-1",
        help="session audio.input.transcription.model (default %(default)s)",
    )
    return p


def add_bench_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `bench` and its sub-commands to a subparsers object (the main CLI's)."""
    common, streams = _common(), _streams()
    bench = subparsers.add_parser(
        "bench",
        help="load-test a server: latency, capacity, overhead",
        description="Paced load against a voxserve server; JSON, Markdown, PNG in --out.",
    )
    sub = bench.add_subparsers(dest="bench_command", required=True, metavar="SUBCOMMAND")
    bench.set_defaults(handler=run_bench)  # the main CLI calls args.handler(args)

    def add(
        name: str,
        run: str,
        help_text: str,
        *parents: argparse.ArgumentParser,
    ) -> argparse.ArgumentParser:
        parser = sub.add_parser(
            name, parents=[common, *parents], help=help_text, description=help_text
        )
        parser.set_defaults(bench_run=run)
        return parser

    add("stream", "cmd_stream", "N concurrent paced streams for T seconds", streams)
    ramp = add(
        "ramp",
        "cmd_ramp",
        "steps of concurrency until the P99 budget or 1 percent errors break; reports the knee",
        streams,
    )
    ramp.add_argument(
        "--steps",
        type=_ints,
        default=[50, 100, 200, 500, 1000, 2000],
        help="stream counts, comma-separated",
    )
    ramp.add_argument(
        "--budget-ms", type=float, default=20.0, help="P99 budget (default %(default)s)"
    )
    ramp.add_argument(
        "--budget-metric",
        default="mark_lag",
        help="latency the budget applies to (default %(default)s)",
    )
    ramp.add_argument(
        "--all-steps",
        action="store_true",
        help="run every step even past the budget or an invalid step (for on/off comparisons)",
    )
    ramp.add_argument(
        "--standalone",
        action="store_true",
        help="also measure the --server-config engines directly in this process",
    )
    tts = add("tts", "cmd_tts", "HTTP speech requests at a target rate with a hot-sentence mix")
    tts.add_argument(
        "--rate", type=float, default=5.0, help="requests per second (default %(default)s)"
    )
    tts.add_argument("--duration", type=float, default=20.0)
    tts.add_argument(
        "--hot-fraction", type=float, default=0.5, help="share of requests for the hot sentences"
    )
    tts.add_argument("--hot-sentences", type=int, default=3, help="how many hot sentences")
    tts.add_argument(
        "--uniform", action="store_true", help="evenly spaced requests (default: Poisson arrivals)"
    )
    tts.add_argument(
        "--max-inflight",
        type=int,
        default=256,
        help="requests open at once before new ones are refused (counted)",
    )
    sweep = add(
        "sweep-chunk",
        "cmd_sweep",
        "ASR latency and WER per chunk_ms, and with partials off",
        streams,
    )
    sweep.add_argument("--chunks", type=_ints, default=[160, 320, 480, 640], help="chunk_ms values")
    sweep.add_argument("--skip-off", action="store_true", help="leave out the partials-off row")
    base = add(
        "baseline",
        "cmd_baseline",
        "voxserve vs a bare websockets echo server under the same load",
        streams,
    )
    base.add_argument(
        "--rounds", type=int, default=2, help="alternations voxserve/echo (default %(default)s)"
    )
    base.add_argument(
        "--echo-loop",
        choices=("asyncio", "uvloop"),
        default="uvloop",
        help="the echo server's event loop (default %(default)s: the reference of "
        "docs/benchmarks.md's targets, a bare websockets + uvloop server; figures before "
        "2026-11-29 21:30 used asyncio)",
    )
    base.add_argument(
        "--pin",
        action="store_true",
        help="each server (voxserve, then the echo server) on core 0 and the load on the "
        "other cores: both measured under one placement, the client never on the server's "
        "core (the ratio still moves from run to run on a VM: docs/benchmarks.md)",
    )
    realtime = add(
        "realtime",
        "voxserve.bench.realtime_bench:cmd_realtime",
        "the OpenAI Realtime doorway against /v1/stream (and WebRTC calls: --transports): the "
        "same assistant streams through each, interleaved in one run; end of speech -> first "
        "audio, and streams per core",
        streams,
    )
    _realtime_arguments(realtime)
    wyoming = sub.add_parser(
        "wyoming",
        help="Wyoming transcripts at real-time pace: first transcript-chunk and the final, "
        "side by side with other Wyoming servers",
        description="Wyoming transcripts at real-time pace (voxserve/bench/wyoming_bench.py).",
    )
    wyoming.set_defaults(bench_run="voxserve.bench.wyoming_bench:cmd_wyoming")
    from voxserve.bench.wyoming_bench import add_wyoming_arguments

    add_wyoming_arguments(wyoming)
    eng = add(
        "engines",
        "cmd_engines",
        "the --server-config engines called directly: cost per audio second",
        streams,
    )
    eng.set_defaults(spawn=False)
    from voxserve.bench.memory import add_memory_parsers
    from voxserve.bench.soak import add_soak_arguments

    soak = add(
        "soak",
        "voxserve.bench.soak:cmd_soak",
        "a long paced run: RSS flat after warm-up, no leaked tasks/threads/fds, tracemalloc diff",
        streams,
    )
    add_soak_arguments(soak)
    add_memory_parsers(add, streams)
    from voxserve.bench.tts_burst import add_tts_burst_parsers

    add_tts_burst_parsers(add)
    from voxserve.bench.speech_cache import add_speech_cache_parser

    add_speech_cache_parser(add)


TRANSPORTS = ("stream", "realtime", "webrtc")
DEFAULT_TRANSPORTS = ("stream", "realtime")


def _transports(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names or any(n not in TRANSPORTS for n in names) or len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(TRANSPORTS)}, got {text!r}")
    return names


def _realtime_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("comparison")
    g.add_argument(
        "--transports",
        type=_transports,
        default=list(DEFAULT_TRANSPORTS),
        help="comma-separated, of stream,realtime,webrtc: run in this order, then reversed "
        "every other round (default stream,realtime; realtime alone: a Realtime ramp; "
        "realtime,webrtc: WebRTC calls against Realtime WebSocket sessions)",
    )
    g.add_argument(
        "--rounds", type=int, default=1, help="rounds per stream count (default %(default)s)"
    )
    g.add_argument(
        "--steps",
        type=_ints,
        help="stream counts, comma-separated: a ramp until the budget breaks (default --streams)",
    )
    g.add_argument(
        "--budget-metric",
        default="turn",
        help="latency the budget applies to (default %(default)s: end of speech -> first audio)",
    )
    g.add_argument(
        "--budget-ms",
        type=float,
        default=1000.0,
        help="P99 budget (default %(default)s: the load engines' 500 ms hangover + 500 ms; "
        "for real engines, their turn at low load plus a margin)",
    )
    g.add_argument("--all-steps", action="store_true", help="run every step past the budget")


def run_bench(args: argparse.Namespace) -> int:
    """Run the chosen sub-command; a problem the user can fix is one line and exit 2."""
    import httpx

    try:
        from voxserve.bench import commands  # matplotlib and friends: only when running

        where, _, name = args.bench_run.rpartition(":")  # "module:function" or a command
        module = importlib.import_module(where) if where else commands
        run: Callable[[argparse.Namespace], int] = getattr(module, name)
        code = run(args)
        return code
    except (OSError, ValueError, TimeoutError, RuntimeError, httpx.HTTPError) as exc:
        eprint(f"voxserve bench: error: {exc}")
        return 2

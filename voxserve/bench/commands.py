"""One runner per sub-command. Each returns an exit code and writes DIR/summary.json,
DIR/steps.jsonl, DIR/summary.md and its charts; every run is bounded by its flags."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from voxserve.bench import charts, engine_batches, frame_lag, http_tts, loadgen
from voxserve.bench.procstat import pin_servers
from voxserve.bench.program import Program
from voxserve.bench.report import Report, eprint
from voxserve.bench.schedule import split_evenly
from voxserve.bench.servers import realtime_url, spawn_echo
from voxserve.bench.step import Plan, Step, run_step
from voxserve.bench.target import SENTENCES, Target, audio_program, target
from voxserve.bench.verdict import budget_problems, knee
from voxserve.bench.workers import Job


def _run_against(
    tgt: Target, args: argparse.Namespace, plan: Plan, job: Job[Any], specs: Sequence[Any]
) -> Step:
    """One step against the target (its CPU sampled), as --procs and --quiet say."""
    return run_step(
        plan, job, specs, server_pid=tgt.pid, inline=args.procs == 0, progress=not args.quiet
    )


def ramp_seconds(args: argparse.Namespace) -> float:
    return float(args.ramp) if args.ramp is not None else min(5.0, args.duration / 4)


def tts_texts(args: argparse.Namespace) -> tuple[str, ...]:
    """The tts streams' messages: --sentences-per-text of the bench sentences each, so a
    reply can have a tail (later sentences) for other replies' first chunks to overtake."""
    k = max(1, getattr(args, "sentences_per_text", 1))
    n = len(SENTENCES)
    return tuple(" ".join(SENTENCES[(i + j) % n] for j in range(k)) for i in range(n))


def session_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if args.voice:
        fields["voice"] = args.voice
    if args.chunk_ms is not None:
        fields["chunk_ms"] = args.chunk_ms
    if args.partials is not None:
        fields["partials"] = args.partials
    if getattr(args, "sample_rate", None):
        fields["sample_rate"] = fields["output_sample_rate"] = args.sample_rate
    turns = getattr(args, "turn_detection", None)
    if turns and len(turns) == 1:
        fields["turn_detection"] = turns[0]
    return fields


def stream_step(
    args: argparse.Namespace,
    tgt: Target,
    program: Program | None,
    streams: int,
    label: str,
    *,
    session: dict[str, Any] | None = None,
    mode: str | None = None,
) -> Step:
    """N paced WebSocket streams against tgt for --duration seconds (+ ramp and drain)."""
    mode = mode or args.mode
    spec = loadgen.StepSpec(
        url=tgt.url,
        mode=mode,
        streams=streams,
        duration_s=args.duration,
        ramp_s=ramp_seconds(args),
        program=program if mode != "tts" else None,
        texts=tts_texts(args),
        session={**session_fields(args), **(session or {})},
        mark_every_s=args.mark_every,
        hangover_s=args.hangover_ms / 1000,
        drain_s=args.drain,
        deflate=args.deflate,
        session_s=getattr(args, "session_s", 0.0),
        api_key=args.api_key,
        model=args.model,
        piece_ms=args.piece_ms,
        transcription_model=args.transcription_model,
        loss=getattr(args, "loss", 0.0),
        seed=args.seed,
    )
    parts = split_evenly(streams, max(1, min(args.procs, streams)))
    specs = [dataclasses.replace(spec, first=first, count=count) for first, count in parts]
    params = {"mode": mode, "procs": len(specs), **spec.session}
    if mode == "realtime":  # session.start fields mean nothing there; what it sends does
        params = {"mode": mode, "procs": len(specs), "model": spec.model, "piece_ms": spec.piece_ms}
    if mode == "webrtc":
        params = {"mode": mode, "procs": len(specs), "loss": spec.loss}
    plan = Plan(label, streams, args.duration, spec.ramp_s, args.drain, params)
    where = realtime_url(tgt.url, spec.model) if mode == "realtime" else tgt.url
    if mode == "webrtc":
        where = f"{tgt.http}/v1/realtime/calls"
    eprint(f"bench: {label}: {streams} {mode} streams for {args.duration:g} s against {where}")
    batches_before = engine_batches.read(tgt.http)
    lag_before = frame_lag.read(tgt.http) if mode == "webrtc" else None
    step = _run_against(tgt, args, plan, loadgen.run, specs)
    step.record["per_server_core"] = per_server_core(step.record)
    step.record["engine_batches"] = engine_batches.during(
        batches_before, engine_batches.read(tgt.http)
    )
    if mode == "webrtc":
        server_lag(step.record, frame_lag.during(lag_before, frame_lag.read(tgt.http)))
    return step


def server_lag(record: dict[str, Any], buckets: frame_lag.Buckets | None) -> None:
    """The step's server frame lag: a latency (so `--budget-metric frame_lag` applies) and
    its buckets (to pool rounds)."""
    record["frame_lag_buckets"] = frame_lag.to_json(buckets)
    if (lag := frame_lag.summary(buckets)) is not None:
        record["latency_ms"]["frame_lag"] = lag


def per_server_core(record: dict[str, Any]) -> dict[str, float | None]:
    """Finals/s and reply speech s/s per core of server CPU: what one core of the server
    delivers, comparable with the engine standalone (bench/standalone.py). From the server's
    CPU seconds over the whole step (drain included) and everything delivered in it, so a
    server that fell behind and caught up in the drain is not flattered."""
    server = record.get("server") or {}
    cpu_s = server.get("cpu_s_whole_step")
    counts = record.get("counts") or {}
    if not cpu_s:
        return {"finals_per_s": None, "speech_s_per_s": None, "cpu_ms_per_final": None}
    finals, speech_s = counts.get("finals", 0), counts.get("audio_ms", 0) / 1000
    return {
        "finals_per_s": round(finals / cpu_s, 2) if finals else None,
        "speech_s_per_s": round(speech_s / cpu_s, 2) if speech_s else None,
        "cpu_ms_per_final": round(cpu_s * 1000 / finals, 1) if finals else None,
    }


@contextlib.contextmanager
def _report(args: argparse.Namespace, command: str) -> Iterator[Report]:
    report = Report(Path(args.out), command, sys.argv)
    yield report


def _cdf(report: Report, steps: list[Step], name: str = "latency_cdf.png") -> None:
    charts.latency_cdf(report.out / name, [(s.record["label"], s.raw.samples) for s in steps])


def _done(report: Report, head: dict[str, Any] | None, extra: dict[str, Any], url: str) -> int:
    path = report.write(head, extra, url)
    eprint(f"bench: wrote {path} and {report.out / 'summary.md'}")
    print((report.out / "summary.md").read_text())
    return 0


def cmd_stream(args: argparse.Namespace) -> int:
    if args.turn_detection and len(args.turn_detection) > 1:
        return _turn_tradeoff(args)
    with _report(args, "stream") as report, target(args, report.out) as tgt:
        program = audio_program(args, tgt) if args.mode != "tts" else None
        step = stream_step(args, tgt, program, args.streams, f"{args.streams} streams")
        report.add(step.record)
        _cdf(report, [step])
        return _done(report, step.record, {}, tgt.url)


def _turn_tradeoff(args: argparse.Namespace) -> int:
    """One step per --turn-detection (same streams, audio and server): turn latency against
    the premature-turn rate (turns.png, summary.json `turns`)."""
    with _report(args, "stream") as report, target(args, report.out) as tgt:
        program = audio_program(args, tgt)
        steps: list[Step] = []
        for td in args.turn_detection:
            label = f"{args.streams} streams {turn_label(td)}"
            step = stream_step(
                args, tgt, program, args.streams, label, session={"turn_detection": td}
            )
            report.add(step.record)
            steps.append(step)
            time.sleep(args.cooldown)
        rows = [_turn_row(s.record) for s in steps]
        charts.turns(report.out / "turns.png", rows)
        _cdf(report, steps)
        return _done(report, steps[-1].record, {"turns": rows}, tgt.url)


def turn_label(td: dict[str, Any]) -> str:
    """A step's name for a turn_detection: semantic_vad:auto, server_vad:500."""
    setting = td.get("eagerness", td.get("silence_duration_ms", ""))
    return f"{td['type']}:{setting}" if setting != "" else str(td["type"])


def _turn_row(record: dict[str, Any]) -> dict[str, Any]:
    turn = record["latency_ms"].get("turn") or {}
    return {
        "label": record["label"],
        "turn_p50_ms": turn.get("p50"),
        "turn_p99_ms": turn.get("p99"),
        "premature_turn_rate": record.get("premature_turn_rate"),
    }


def cmd_ramp(args: argparse.Namespace) -> int:
    if args.mode in ("realtime", "webrtc") and args.budget_metric == "mark_lag":
        raise ValueError(
            f"{args.mode} streams send no marks: use --budget-metric turn (or vad_end; "
            "webrtc: frame_lag, the server's outgoing frame lag)"
        )
    with _report(args, "ramp") as report, target(args, report.out) as tgt:
        program = audio_program(args, tgt) if args.mode != "tts" else None
        extra: dict[str, Any] = {"budget": {"metric": args.budget_metric, "p99_ms": args.budget_ms}}
        if args.standalone:
            extra["standalone"] = standalone_figures(args, program)
        steps: list[Step] = []
        for n in args.steps:
            step = stream_step(args, tgt, program, n, f"{n} streams")
            problems = budget_problems(step.record, args.budget_metric, args.budget_ms)
            step.record |= {"within_budget": not problems, "budget_problems": problems}
            report.add(step.record)
            steps.append(step)
            if (problems or not step.record["valid"]) and not args.all_steps:
                break
            time.sleep(args.cooldown)
        records = [s.record for s in steps]
        extra["knee"] = knee(records) | per_core(records)
        charts.ramp(report.out / "ramp.png", records, args.budget_metric, args.budget_ms)
        _cdf(report, steps)
        good = [s.record for s in steps if s.record["streams"] == extra["knee"]["streams"]]
        return _done(report, good[0] if good else records[-1], extra, tgt.url)


def per_core(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Streams per server core at the knee: streams / (server CPU % / 100)."""
    good = [r for r in records if r.get("within_budget") and r.get("valid")]
    if not good or not (good[-1].get("server") or {}).get("cpu_percent"):
        return {"streams_per_core": None}
    last = good[-1]
    cpu = last["server"]["cpu_percent"]
    return {"server_cpu_percent": cpu, "streams_per_core": round(last["streams"] / (cpu / 100), 1)}


def standalone_figures(args: argparse.Namespace, program: Program | None) -> dict[str, Any]:
    """The server's engines (same config and env) measured in this process."""
    import os

    from voxserve.bench import standalone
    from voxserve.config import load_settings

    env = dict(item.split("=", 1) for item in args.server_env)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        settings = load_settings(args.server_config)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    eprint("bench: measuring the engines standalone in this process")
    chunk = args.chunk_ms or settings.asr.partial_interval_ms
    partials = settings.asr.partials if args.partials is None else args.partials
    return standalone.measure(settings, program, SENTENCES, chunk, partials)


def cmd_engines(args: argparse.Namespace) -> int:
    with _report(args, "engines") as report:
        program = audio_program(args, Target(args.url, None)) if args.source != "tts" else None
        extra = {"standalone": standalone_figures(args, program)}
        return _done(report, None, extra, "")


def cmd_baseline(args: argparse.Namespace) -> int:
    """voxserve and a bare websockets echo server under the same load, alternated."""
    with _report(args, "baseline") as report, target(args, report.out) as tgt:
        program = audio_program(args, tgt)
        with spawn_echo(report.out / "echo.log", loop=args.echo_loop) as echo:
            if args.pin:
                pin_servers(tgt.pid, echo.pid)
            steps: dict[str, list[Step]] = {"voxserve": [], "echo": []}
            for r in range(args.rounds):
                for name, t in (("voxserve", tgt), ("echo", Target(echo.url, echo.pid))):
                    step = stream_step(
                        args, t, program, args.streams, f"{name} r{r + 1}", mode="asr"
                    )
                    report.add(step.record)
                    steps[name].append(step)
                    time.sleep(args.cooldown)
        extra = {"overhead": overhead(steps), "echo_loop": args.echo_loop, "pinned": args.pin}
        _cdf(report, steps["voxserve"] + steps["echo"])
        return _done(report, steps["voxserve"][-1].record, extra, tgt.url)


def overhead(steps: dict[str, list[Step]]) -> dict[str, Any]:
    """Medians over rounds for each server, and voxserve / echo ratios."""

    def med(name: str, get: Any) -> float | None:
        values = [v for s in steps[name] if (v := get(s.record)) is not None]
        return round(statistics.median(values), 3) if values else None

    figures = {
        "server_cpu_percent": lambda r: (r.get("server") or {}).get("cpu_percent"),
        "rss_mb_max": lambda r: (r.get("server") or {}).get("rss_mb_max"),
        "ctx_switches_per_s": lambda r: _ctx(r),
        "mark_lag_p50_ms": lambda r: (r["latency_ms"].get("mark_lag") or {}).get("p50"),
        "mark_lag_p99_ms": lambda r: (r["latency_ms"].get("mark_lag") or {}).get("p99"),
    }
    out: dict[str, Any] = {}
    for key, get in figures.items():
        vox, echo = med("voxserve", get), med("echo", get)
        out[key] = {
            "voxserve": vox,
            "echo": echo,
            "ratio": round(vox / echo, 2) if vox and echo else None,
        }
    # The overhead ratio: voxserve's streams per core of CPU as a share of the bare
    # server's, under the same load (>= 0.70 is the target).
    cpu = out["server_cpu_percent"]
    out["capacity_vs_echo"] = (
        round(cpu["echo"] / cpu["voxserve"], 3) if cpu["echo"] and cpu["voxserve"] else None
    )
    out["valid"] = all(s.record["valid"] for group in steps.values() for s in group)
    return out


def _ctx(record: dict[str, Any]) -> float | None:
    server = record.get("server") or {}
    if "ctx_voluntary_per_s" not in server:
        return None
    return float(server["ctx_voluntary_per_s"] + server["ctx_involuntary_per_s"])


def cmd_sweep(args: argparse.Namespace) -> int:
    """ASR latency and WER per chunk size (partials on), and partials off."""
    configs = [(c, True) for c in args.chunks] + (
        [] if args.skip_off else [(max(args.chunks), False)]
    )
    with _report(args, "sweep-chunk") as report, target(args, report.out) as tgt:
        program = audio_program(args, tgt)
        steps, rows = [], []
        for chunk, partials in configs:
            label = f"chunk {chunk} ms" if partials else "partials off"
            step = stream_step(
                args,
                tgt,
                program,
                args.streams,
                label,
                session={"chunk_ms": chunk, "partials": partials},
                mode="asr",
            )
            report.add(step.record)
            steps.append(step)
            rows.append(sweep_row(step.record, chunk, partials))
            time.sleep(args.cooldown)
        charts.sweep(report.out / "sweep_chunk.png", rows)
        _cdf(report, steps)
        return _done(report, steps[-1].record, {"sweep": rows}, tgt.url)


def sweep_row(record: dict[str, Any], chunk: int, partials: bool) -> dict[str, Any]:
    lat = record["latency_ms"]
    counts = record["counts"]
    utterances = counts.get("utterances") or 0
    return {
        "chunk_ms": chunk,
        "partials": partials,
        "ttfp_p50_ms": (lat.get("ttfp") or {}).get("p50"),
        "ttfp_p99_ms": (lat.get("ttfp") or {}).get("p99"),
        "final_p50_ms": (lat.get("final") or {}).get("p50"),
        "final_p99_ms": (lat.get("final") or {}).get("p99"),
        "wer": record.get("wer"),
        "partials_per_utterance": round(counts.get("partials", 0) / utterances, 2)
        if utterances
        else None,
        "server_cpu_percent": (record.get("server") or {}).get("cpu_percent"),
        "valid": record["valid"],
    }


def cmd_tts(args: argparse.Namespace) -> int:
    """Open-loop HTTP speech requests at --rate for --duration seconds."""
    with _report(args, "tts") as report, target(args, report.out) as tgt:
        hot = SENTENCES[: args.hot_sentences]
        procs = max(1, args.procs)
        specs = [
            http_tts.SpeechSpec(
                base_url=tgt.http,
                rate=args.rate / procs,
                duration_s=args.duration,
                hot_texts=hot,
                cold_texts=SENTENCES,
                hot_fraction=args.hot_fraction,
                voice=args.voice,
                poisson=not args.uniform,
                seed=args.seed + i,
                max_inflight=args.max_inflight,
                drain_s=args.drain,
            )
            for i in range(procs)
        ]
        expected = max(1, round(args.rate * args.duration))
        params = {
            "mode": "http-speech",
            "rate": args.rate,
            "hot_fraction": args.hot_fraction,
            "procs": procs,
            "unit": "requests",
        }
        plan = Plan(f"{args.rate:g} req/s", expected, args.duration, 0.0, args.drain, params)
        eprint(f"bench: {args.rate:g} speech requests/s for {args.duration:g} s against {tgt.http}")
        step = _run_against(tgt, args, plan, http_tts.run, specs)
        step.record["error_rate"] = round(
            step.raw.failed_streams / max(1, step.raw.counts["requests"]), 4
        )
        report.add(step.record)
        _cdf(report, [step])
        return _done(report, step.record, {}, tgt.url)

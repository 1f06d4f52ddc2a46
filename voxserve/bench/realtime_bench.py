"""`voxserve bench realtime`: the OpenAI Realtime doorway against /v1/stream, in one run.

The same assistant streams (same WAVs, same 20 ms pace, same 24 kHz audio in and out unless
--sample-rate says otherwise) go through /v1/stream (`mode: assistant`) and through
/v1/realtime (`RealtimeStream`), one transport at a time, alternating the order every round
(ABBA) so neither always runs on the warmer server. Per transport and stream count it reports
end of speech -> first reply audio (`turn`) P50/P90/P99 pooled over the rounds, speech
stopped (`vad_end`), final transcript, errors, the server's CPU and the generator's lateness;
per transport the knee (the last valid step within the budget, as `bench ramp` finds it) and
streams per server core there.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from voxserve.bench import frame_lag
from voxserve.bench.commands import _cdf, _report, per_core, stream_step
from voxserve.bench.records import Raw, merged
from voxserve.bench.report import eprint
from voxserve.bench.stats import normalize, summarize, wer
from voxserve.bench.step import Step
from voxserve.bench.target import audio_program, target
from voxserve.bench.verdict import budget_problems, knee

# transport -> the step's mode
MODES = {"stream": "assistant", "realtime": "realtime", "webrtc": "webrtc"}
# (a, b): the row "a - b" is reported when both ran
DIFFS = (("realtime", "stream"), ("webrtc", "realtime"), ("webrtc", "stream"))
COMPARED = ("turn", "vad_end", "final", "ttfp")


def cmd_realtime(args: argparse.Namespace) -> int:
    # Assistant turns on both transports (the audio program's 3 s gap). Set here, not with
    # the sub-parser's set_defaults: that would change the `--mode` action every bench
    # command shares through its parent parser (soak's streams became Realtime ones).
    args.mode = "realtime"
    if args.sample_rate is None:
        args.sample_rate = 24_000  # what a Realtime client sends and gets (audio/pcm)
    counts = args.steps or [args.streams]
    steps: list[Step] = []
    with _report(args, "realtime") as report, target(args, report.out) as tgt:
        program = audio_program(args, tgt)
        broke: set[str] = set()
        for n in counts:
            for r in range(args.rounds):
                order = args.transports if r % 2 == 0 else args.transports[::-1]
                for name in (t for t in order if t not in broke):
                    label = f"{name} {n} r{r + 1}"
                    step = stream_step(args, tgt, program, n, label, mode=MODES[name])
                    problems = budget_problems(step.record, args.budget_metric, args.budget_ms)
                    step.record |= {
                        "transport": name,
                        "within_budget": not problems,
                        "budget_problems": problems,
                    }
                    report.add(step.record)
                    steps.append(step)
                    time.sleep(args.cooldown)
            if not args.all_steps:
                broke |= {t for t in args.transports if not _good(steps, t, n)}
                if broke >= set(args.transports):
                    break
        records = [s.record for s in steps]
        extra: dict[str, Any] = {
            "budget": {"metric": args.budget_metric, "p99_ms": args.budget_ms},
            "comparison": comparison(steps, args.transports),
            "knee": {t: knee(_of(records, t)) | per_core(_of(records, t)) for t in args.transports},
        }
        _cdf(report, steps)
        path = report.write(_headline(records), extra, tgt.url)
        with (report.out / "summary.md").open("a") as f:
            f.write(markdown(extra, args.transports))
    eprint(f"bench: wrote {path} and {report.out / 'summary.md'}")
    print((report.out / "summary.md").read_text())
    return 0


def _of(records: Sequence[dict[str, Any]], transport: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("transport") == transport]


def _good(steps: Sequence[Step], transport: str, n: int) -> bool:
    ours = [
        s.record for s in steps if s.record["transport"] == transport and s.record["streams"] == n
    ]
    return all(r["within_budget"] and r["valid"] for r in ours)


def _headline(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    ours = _of(records, "webrtc") or _of(records, "realtime") or list(records)
    return ours[-1] if ours else None


def comparison(steps: Sequence[Step], transports: Sequence[str]) -> list[dict[str, Any]]:
    """One row per stream count: each transport's figures over its rounds (latencies pooled,
    so P99 is over every turn measured, not a median of P99s) and realtime - stream."""
    rows = []
    for n in sorted({s.record["streams"] for s in steps}):
        row: dict[str, Any] = {"streams": n}
        for t in transports:
            ours = [s for s in steps if s.record["transport"] == t and s.record["streams"] == n]
            if ours:
                row[t] = figures(ours)
        for a, b in DIFFS:
            if a in row and b in row:
                row[f"{a}_vs_{b}_transcripts_differing"] = differing(
                    [s for s in steps if s.record["transport"] == a and s.record["streams"] == n],
                    [s for s in steps if s.record["transport"] == b and s.record["streams"] == n],
                )
                row[f"{a}_minus_{b}_ms"] = {
                    key: round(x - y, 1)
                    for key, x in row[a].items()
                    if key.endswith("_ms")
                    and isinstance(x, float)
                    and isinstance(y := row[b].get(key), float)
                }
        rows.append(row)
    return rows


def differing(ours: Sequence[Step], theirs: Sequence[Step]) -> int:
    """Utterances whose transcript (normalised, matched by reference) one transport heard
    and the other did not: the streams play the same recordings, so 0 is the same words."""

    def heard(steps: Sequence[Step]) -> Counter[tuple[str, str]]:
        pairs = merged([s.raw for s in steps]).transcripts
        return Counter((normalize(ref), normalize(hyp)) for ref, hyp in pairs)

    return sum((heard(ours) - heard(theirs)).values())


def figures(steps: Sequence[Step]) -> dict[str, Any]:
    """Pooled latencies (ms) and counts of one transport's rounds at one stream count; the
    server's CPU as the median over the rounds."""
    raw: Raw = merged([s.raw for s in steps])
    out: dict[str, Any] = {"rounds": len(steps)}
    for metric in COMPARED:
        summary = summarize(raw.samples.get(metric, []))
        out[f"{metric}_count"] = int(summary["count"] or 0)
        for p in ("p50", "p90", "p99"):
            out[f"{metric}_{p}_ms"] = summary[p]
    cpu = [c for s in steps if (c := (s.record.get("server") or {}).get("cpu_percent"))]
    out["server_cpu_percent"] = round(statistics.median(cpu), 1) if cpu else None
    streams = steps[0].record["streams"]
    out["server_cpu_percent_per_stream"] = (
        round(out["server_cpu_percent"] / streams, 3) if cpu and streams else None
    )
    late = summarize(raw.lateness)
    out["send_lateness_p99_ms"] = late["p99"]
    lag = frame_lag.summary(
        frame_lag.pooled(frame_lag.from_json(s.record.get("frame_lag_buckets")) for s in steps)
    )
    if lag is not None:  # webrtc: the server's outgoing frames (bucket upper bounds)
        out["frame_lag_p50_ms"], out["frame_lag_p99_ms"] = lag["p50"], lag["p99"]
        out["frame_lag_over_20ms_share"] = lag["over_20ms_share"]
    for key in ("packets_sent", "packets_dropped", "server_packets_lost", "server_concealed_ms"):
        if raw.counts.get(key):
            out[key] = raw.counts[key]
    out["utterances_scored"] = len(raw.transcripts)
    score = wer(raw.transcripts) if raw.counts["finals"] else None
    out["wer"] = None if score is None else round(score, 4)
    out["replies"] = raw.counts["replies"]
    out["errors"] = dict(sorted(raw.errors.items()))
    out["failed_streams"] = raw.failed_streams
    out["valid"] = all(s.record["valid"] for s in steps)
    return out


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}"


NAMES = {"stream": "/v1/stream", "realtime": "Realtime (WebSocket)", "webrtc": "WebRTC calls"}


def _title(transports: Sequence[str]) -> str:
    if set(transports) == {"stream", "realtime"}:
        return "Realtime vs /v1/stream"  # the doorway's comparison, as issue 21 named it
    return " vs ".join(NAMES[t] for t in transports)


def _wer(f: dict[str, Any]) -> str:
    return "-" if f.get("wer") is None else f"{f['wer']:.3f} ({f['utterances_scored']})"


def _wer_diff(row: dict[str, Any], a: str, b: str) -> str:
    """WER a - b, and the utterances heard differently (matched by reference)."""
    x, y = row[a].get("wer"), row[b].get("wer")
    if x is None or y is None:
        return "-"
    return f"{x - y:+.3f}; {row[f'{a}_vs_{b}_transcripts_differing']} differ"


def _lag(f: dict[str, Any]) -> str:
    if "frame_lag_p99_ms" not in f:
        return "-"
    p50, p99 = f["frame_lag_p50_ms"], f["frame_lag_p99_ms"]
    return f"<= {_ms(p50)} / " + (f"<= {_ms(p99)}" if p99 is not None else "> 200")


def markdown(extra: dict[str, Any], transports: Sequence[str]) -> str:
    """The comparison as a table, appended to summary.md."""
    lines = [
        "",
        "## " + _title(transports),
        "",
        "| streams | transport | turns | turn P50 / P90 / P99 (ms) | speech stopped P50 / P99 "
        "| final P50 / P99 | WER (utterances) | server CPU % | CPU % per stream "
        "| server frame lag P50 / P99 | errors | valid |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in extra["comparison"]:
        for t in transports:
            if t not in row:
                continue
            f = row[t]
            errors = ", ".join(f"{k} {v}" for k, v in f["errors"].items()) or "0"
            lines.append(
                f"| {row['streams']} | {t} | {f['turn_count']} | {_ms(f['turn_p50_ms'])} / "
                f"{_ms(f['turn_p90_ms'])} / {_ms(f['turn_p99_ms'])} | {_ms(f['vad_end_p50_ms'])}"
                f" / {_ms(f['vad_end_p99_ms'])} | {_ms(f['final_p50_ms'])} / "
                f"{_ms(f['final_p99_ms'])} | {_wer(f)} | {_ms(f['server_cpu_percent'])} | "
                f"{f['server_cpu_percent_per_stream'] or '-'} | {_lag(f)} | {errors} | "
                f"{'yes' if f['valid'] else 'NO'} |"
            )
        for a, b in DIFFS:
            diff = row.get(f"{a}_minus_{b}_ms")
            if not diff:
                continue
            lines.append(
                f"| {row['streams']} | {a} - {b} | | {_ms(diff.get('turn_p50_ms'))} / "
                f"{_ms(diff.get('turn_p90_ms'))} / {_ms(diff.get('turn_p99_ms'))} | "
                f"{_ms(diff.get('vad_end_p50_ms'))} / {_ms(diff.get('vad_end_p99_ms'))} | "
                f"{_ms(diff.get('final_p50_ms'))} / {_ms(diff.get('final_p99_ms'))} | "
                f"{_wer_diff(row, a, b)} | | | | | |"
            )
    lines.append("")
    budget = extra["budget"]
    for t in transports:
        k = extra["knee"][t]
        lines.append(
            f"- {t}: knee {k['streams']} streams ({budget['metric']} P99 <= "
            f"{budget['p99_ms']:g} ms, valid), broke at {k['broke_at']}; "
            f"streams per server core {k.get('streams_per_core') or '-'}"
        )
    return "\n".join(lines) + "\n"

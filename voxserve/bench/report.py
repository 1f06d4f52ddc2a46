"""Output files: DIR/summary.json (headline p50/p90/p99 + every step), DIR/steps.jsonl (one
record per step, appended as steps finish), DIR/summary.md (a short table to read)."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from voxserve import __version__
from voxserve.bench.stats import PERCENTILES


def machine() -> dict[str, Any]:
    """What the numbers were measured on, and how busy it already was."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }


def headline(record: Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
    """{"p50": {metric_ms: value}, "p90": ..., "p99": ...} of one step."""
    out: dict[str, dict[str, float | None]] = {f"p{p}": {} for p in PERCENTILES}
    for metric, summary in record.get("latency_ms", {}).items():
        for p in PERCENTILES:
            out[f"p{p}"][f"{metric}_ms"] = summary.get(f"p{p}")
    return out


class Report:
    def __init__(self, out: Path, command: str, argv: Sequence[str]) -> None:
        self.out = out
        self.command = command
        out.mkdir(parents=True, exist_ok=True)
        self.steps_path = out / "steps.jsonl"
        self.steps_path.write_text("")
        self.records: list[dict[str, Any]] = []
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.machine = machine()
        self.argv = list(argv)

    def add(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        with self.steps_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def write(self, head: Mapping[str, Any] | None, extra: Mapping[str, Any], url: str) -> Path:
        summary = {
            "tool": "voxserve bench",
            "command": self.command,
            "argv": self.argv,
            "version": __version__,
            "started": self.started,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "url": url,
            "machine": self.machine | {"loadavg_end": [round(x, 2) for x in os.getloadavg()]},
            "headline_step": head.get("label") if head else None,
            **(headline(head) if head else {f"p{p}": {} for p in PERCENTILES}),
            **extra,
            "steps": self.records,
        }
        path = self.out / "summary.json"
        path.write_text(json.dumps(summary, indent=2) + "\n")
        (self.out / "summary.md").write_text(markdown(summary))
        return path


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}"


def _p(record: Mapping[str, Any], metric: str, p: str) -> str:
    return _ms((record.get("latency_ms", {}).get(metric) or {}).get(p))


COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("mark lag p50/p99", "mark_lag", ""),
    ("ttfp p50/p99", "ttfp", ""),
    ("final p50/p99", "final", ""),
    ("speech stopped p50/p99", "vad_end", ""),
    ("turn p50/p99", "turn", ""),
    ("first audio p50/p99", "first_audio", ""),
    ("underrun p99", "underrun", "p99"),
    ("server frame lag p50/p99", "frame_lag", ""),
)


def markdown(summary: Mapping[str, Any]) -> str:
    steps = summary["steps"]
    host = summary["machine"]
    used = [c for c in COLUMNS if any(r.get("latency_ms", {}).get(c[1]) for r in steps)]
    premature = any(r.get("premature_turn_rate") is not None for r in steps)
    head = [
        "step",
        "streams",
        "valid",
        *(c[0] + " (ms)" for c in used),
        *(["premature turns"] if premature else []),
        "WER",
        "server CPU %",
        "RSS MB",
        "gen late p99",
        "errors",
    ]
    lines = [
        f"# voxserve bench {summary['command']}",
        "",
        f"`{' '.join(summary['argv'])}` at {summary['started']} on {host['cpus']} CPUs "
        f"({host['cpu_model']}), load average {host['loadavg']} -> {host['loadavg_end']}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in steps:
        server = r.get("server") or {}
        cells = [r["label"], str(r["streams"]), "yes" if r["valid"] else "NO"]
        for _, metric, only in used:
            cells.append(
                _p(r, metric, only) if only else f"{_p(r, metric, 'p50')} / {_p(r, metric, 'p99')}"
            )
        if premature:
            rate = r.get("premature_turn_rate")
            cells.append("-" if rate is None else f"{rate:.1%}")
        cells += [
            "-" if r.get("wer") is None else f"{r['wer']:.3f}",
            _ms(server.get("cpu_percent")),
            _ms(server.get("rss_mb_max")),
            _ms(r["loadgen"]["send_lateness_ms"].get("p99")),
            ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "0",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _notes(steps, summary)
    return "\n".join(lines) + "\n"


def _notes(steps: Iterable[Mapping[str, Any]], summary: Mapping[str, Any]) -> list[str]:
    notes = [""]
    for r in steps:
        for reason in r.get("invalid_reasons", []):
            notes.append(f"- {r['label']}: not valid: {reason}")
    for key in ("knee", "overhead", "standalone", "sweep"):
        if key in summary:
            notes.append(f"- {key}: `{json.dumps(summary[key])}`")
    return notes


def eprint(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)

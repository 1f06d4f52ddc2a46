"""One measured step: run the load (one or several processes), sample the server over the
steady window (every stream connected), and reduce it all to one JSON record.

The steady window is [start + ramp, start + ramp + duration]: server CPU, RSS, threads, fds
and context switches are sampled there. Latencies include every measurement of the run
(the ramp too), so a short run still has samples.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from voxserve.bench.procstat import Sampler, snapshot
from voxserve.bench.records import METRICS, Raw
from voxserve.bench.stats import summarize, wer
from voxserve.bench.verdict import generator_problems
from voxserve.bench.workers import Job, run_jobs

SAMPLE_TRANSCRIPTS = 5  # (reference, hypothesis) pairs kept in the record, to eyeball WER


@dataclass(frozen=True)
class Plan:
    """A step's shape, what the record and the sampler need to know."""

    label: str
    streams: int
    duration_s: float
    ramp_s: float
    drain_s: float
    params: dict[str, Any]


@dataclass
class Step:
    record: dict[str, Any]
    raw: Raw


class Progress:
    """One status line on stderr, rewritten in place on a terminal, while a step runs."""

    def __init__(self, label: str, total_s: float, enabled: bool = True) -> None:
        self.label = label
        self.total_s = total_s
        self.enabled = enabled
        self._stop = threading.Event()
        self._tty = sys.stderr.isatty()

    def start(self, start_at: float) -> None:
        if self.enabled:
            threading.Thread(target=self._run, args=(start_at,), daemon=True).start()

    def _run(self, start_at: float) -> None:
        shown = -1
        while not self._stop.wait(0.5 if self._tty else 5.0):
            elapsed = int(max(0.0, time.monotonic() - start_at))
            if elapsed != shown:
                shown = elapsed
                end = "\r" if self._tty else "\n"
                print(f"  {self.label}: {elapsed}/{self.total_s:.0f} s", end=end, file=sys.stderr)

    def stop(self) -> None:
        self._stop.set()
        if self.enabled and self._tty:
            print(file=sys.stderr)


def run_step(
    plan: Plan,
    job: Job[Any],
    specs: Sequence[Any],
    *,
    server_pid: int | None,
    inline: bool = False,
    progress: bool = True,
    on_raw: Callable[[Raw], None] | None = None,
) -> Step:
    """Run the specs (one per load process) and build the step record."""
    sampler = Sampler(server_pid) if server_pid else None
    ticker = Progress(plan.label, plan.ramp_s + plan.duration_s, progress)
    steady = (plan.ramp_s, plan.ramp_s + plan.duration_s)

    def on_start(start_at: float) -> None:
        if sampler is not None:
            sampler.start(start_at + steady[0], start_at + steady[1])
        ticker.start(start_at)

    run_s = plan.ramp_s + plan.duration_s + plan.drain_s + 30
    cpu_before = _cpu_s(server_pid)
    try:
        raw = run_jobs(job, specs, run_s=run_s, on_start=on_start, inline=inline)
    finally:
        ticker.stop()
    server: dict[str, Any] | None = None
    if sampler is not None:
        sampler.join(timeout=5)
        server = sampler.summary()
        cpu_after = _cpu_s(server_pid)
        if server is not None and cpu_before is not None and cpu_after is not None:
            # The whole step, drain included: work a backlog pushed past the steady window
            # still counts (per-final CPU; cpu_percent covers the steady window only).
            server["cpu_s_whole_step"] = round(cpu_after - cpu_before, 3)
    if on_raw is not None:
        on_raw(raw)
    return Step(build_record(plan, raw, server), raw)


def _cpu_s(pid: int | None) -> float | None:
    """CPU seconds the server process has used so far (None if it cannot be read)."""
    if pid is None:
        return None
    try:
        return snapshot(pid).cpu_s
    except (OSError, ValueError, IndexError):
        return None


def build_record(plan: Plan, raw: Raw, server: dict[str, Any] | None) -> dict[str, Any]:
    lateness = summarize(raw.lateness)
    cpu = [p.get("cpu_percent") for p in raw.procs]
    problems = generator_problems(lateness["p99"], cpu, raw.errors)
    counts = dict(sorted(raw.counts.items()))
    # Stream-seconds of load: starts are spread evenly over the ramp.
    span = plan.duration_s + plan.ramp_s / 2 if plan.streams else 0.0
    return {
        "label": plan.label,
        "streams": plan.streams,
        "duration_s": plan.duration_s,
        "ramp_s": plan.ramp_s,
        **plan.params,
        "valid": not problems,
        "invalid_reasons": problems,
        "latency_ms": {m: summarize(raw.samples[m]) for m in METRICS if raw.samples.get(m)},
        # No final at all means no recogniser (the echo baseline): no WER, not WER 1.
        "wer": _rounded(wer(raw.transcripts)) if raw.counts["finals"] else None,
        "premature_turn_rate": premature_turn_rate(raw),
        "transcripts_sample": [list(pair) for pair in raw.transcripts[:SAMPLE_TRANSCRIPTS]],
        "throughput": _throughput(raw, span, plan.duration_s),
        "errors": dict(sorted(raw.errors.items())),
        "error_rate": round(raw.failed_streams / plan.streams, 4) if plan.streams else 0.0,
        "counts": counts,
        "server": server,
        "loadgen": {
            "procs": raw.procs,
            "cpu_percent_max": max((c for c in cpu if c is not None), default=None),
            "send_lateness_ms": lateness,
            "loop_lag_ms": summarize(raw.loop_lag),
        },
    }


def premature_turn_rate(raw: Raw) -> float | None:
    """Utterances a reply began in while the speaker had only paused, over the utterances
    whose end was sent (None without replies: not an assistant run)."""
    counts = raw.counts
    if not raw.samples.get("turn") and not counts["premature_turns"]:
        return None
    return (
        round(counts["premature_turns"] / counts["utterances"], 4) if counts["utterances"] else None
    )


def _throughput(raw: Raw, span_s: float, duration_s: float) -> dict[str, float | None]:
    def rate(value: float, over: float) -> float | None:
        return round(value / over, 2) if over > 0 else None

    counts = raw.counts
    return {
        "audio_in_streams_realtime": rate(counts["frames_sent"] * 0.02, span_s),
        "reply_audio_streams_realtime": rate(counts["audio_ms"] / 1000, span_s),
        "finals_per_s": rate(counts["finals"], span_s),
        "requests_per_s": rate(counts["requests_ok"], duration_s),
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)

"""`voxserve bench soak`: a long paced run that checks memory stays flat and nothing leaks.

The load is `bench stream` (N paced streams for --duration s); with --session-s S each
stream is a run of S-second sessions back to back (session churn). Meanwhile the server is
sampled every --sample-every s: RSS from /proc, and from GET /debug/memory (admin key) its
PSS/USS, threads, fds, asyncio tasks and buffer pool. After --warmup s a tracemalloc
baseline is taken in the server (POST /debug/tracemalloc/snapshot; the server needs
--tracemalloc N, which --spawn sets), and just before the load ends the top differences
(GET /debug/tracemalloc) go into the report. Idle figures before and after the load show
leaked tasks, threads and fds (the "after" figures are the first with nothing left over, or
those SETTLE_S after the streams end); the "before" figures are taken after a short warm-up (two
streams for WARMUP_S), so what a server opens once on first use (a database's journal, a
model file read lazily) is not counted as a leak. A grown fd count names the kinds of
descriptor that grew (sockets, pipes, eventfds, files by path).

Verdict: RSS growth after warm-up (median of the last fifth of the samples under load
against the median of the first fifth after warm-up) below --max-rss-growth percent, and
tasks, fds and threads back to their idle values once the streams are gone (threads may
stay up to the executor's maximum: idle workers are released one per `idle_release_s`).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from voxserve.bench.procstat import snapshot
from voxserve.bench.report import eprint
from voxserve.bench.target import Target, audio_program, target

SETTLE_S = 5.0  # after the streams end: sessions close, tasks finish
SETTLED_POLL_S = 0.25  # how often the idle "after" figures are looked at within SETTLE_S
WARMUP_S = 2.0  # the streams before the idle "before" figures (module docstring)


class Sampler(threading.Thread):
    """Samples the server until stopped; takes the tracemalloc baseline and diff on time."""

    def __init__(
        self,
        client: httpx.Client,
        pid: int | None,
        every_s: float,
        baseline_at: float,
        diff_at: float,
    ) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.client, self.pid, self.every_s = client, pid, every_s
        self.baseline_at, self.diff_at = baseline_at, diff_at
        self.samples: list[dict[str, Any]] = []
        self.tracemalloc: dict[str, Any] | None = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)

    def run(self) -> None:
        """A sample every `every_s` on the clock, not `every_s` after the last one: on a
        loaded machine the server's answers are slow, and the tracemalloc snapshot (seconds
        of a busy server's time) runs in a thread of its own, so neither thins the samples
        that RSS growth is judged on (that left 4 in 6 s under load: "too few warm samples")."""
        started = next_at = time.monotonic()
        baseline_done = diff_done = False
        calls: list[threading.Thread] = []
        while not self._stop_event.wait(max(0.0, next_at + self.every_s - time.monotonic())):
            next_at = max(next_at + self.every_s, time.monotonic() - self.every_s)
            now = time.monotonic()
            sample = server_sample(self.client, self.pid)
            sample["t"] = round(now - started, 1)
            sample["warm"] = baseline_done
            self.samples.append(sample)
            if not baseline_done and now >= self.baseline_at:
                baseline_done = True
                calls.append(self._call(_post, "/debug/tracemalloc/snapshot"))
            elif baseline_done and not diff_done and now >= self.diff_at:
                diff_done = True
                calls[-1].join()  # the diff is against that baseline
                calls.append(self._call(_get, "/debug/tracemalloc?top=15"))
        for call in calls:
            call.join()

    def _call(
        self, method: Callable[[httpx.Client, str], dict[str, Any]], path: str
    ) -> threading.Thread:
        """`method(path)` in its own thread; its answer becomes `tracemalloc`."""

        def run() -> None:
            self.tracemalloc = method(self.client, path)

        thread = threading.Thread(target=run, name="soak-tracemalloc", daemon=True)
        thread.start()
        return thread


def server_sample(client: httpx.Client, pid: int | None) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if pid is not None:
        snap = snapshot(pid)
        found |= {"rss_bytes": snap.rss_bytes, "threads": snap.threads, "fds": snap.fds}
        found["fd_kinds"] = fd_kinds(pid)
    memory = _get(client, "/debug/memory")
    for key in ("rss_bytes", "pss_bytes", "uss_bytes", "threads", "fds", "tasks"):
        if key in memory and key not in found:
            found[key] = memory[key]
    found["tasks"] = memory.get("tasks")
    found["sessions"] = memory.get("sessions_active")
    found["pool_in_use"] = memory.get("pool", {}).get("in_use")
    return found


def settled_sample(
    client: httpx.Client, pid: int | None, before: dict[str, Any], max_threads: int
) -> dict[str, Any]:
    """The idle figures once the streams are gone: the first sample with nothing left over
    against `before` (no session left, `leaks` finds nothing), else the one
    taken SETTLE_S after the streams ended. A leak is what is still there then; waiting the
    whole SETTLE_S every time only made a run longer."""
    give_up = time.monotonic() + SETTLE_S
    while True:
        found = server_sample(client, pid)
        idle = not found.get("sessions") and not leaks(before, found, max_threads)
        if idle or time.monotonic() >= give_up:
            return found
        time.sleep(SETTLED_POLL_S)


def fd_kinds(pid: int) -> dict[str, int]:
    """The process's open descriptors by kind (socket, pipe, anon_inode:[eventfd], or a
    file's path): what an fd figure that grew is made of. {} where /proc cannot say."""
    kinds: dict[str, int] = {}
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return kinds
    for name in names:
        try:
            target = os.readlink(f"{base}/{name}")
        except OSError:
            continue  # closed meanwhile
        kind = target.split(":[", 1)[0] if target.startswith(("socket:", "pipe:")) else target
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def _get(client: httpx.Client, path: str) -> dict[str, Any]:
    try:
        answer = client.get(path)
        body: dict[str, Any] = answer.json()
        return body
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}"}


def _post(client: httpx.Client, path: str) -> dict[str, Any]:
    try:
        body: dict[str, Any] = client.post(path).json()
        return body
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}"}


def rss_growth(samples: list[dict[str, Any]], under_load_until: float) -> dict[str, Any]:
    """Median RSS of the first and last fifth of the warm samples taken under load."""
    warm = [s for s in samples if s["warm"] and s["t"] <= under_load_until and "rss_bytes" in s]
    if len(warm) < 5:
        return {"error": "too few warm samples", "samples": len(warm)}
    fifth = max(1, len(warm) // 5)
    first = statistics.median(s["rss_bytes"] for s in warm[:fifth])
    last = statistics.median(s["rss_bytes"] for s in warm[-fifth:])
    return {
        "first_mb": round(first / 2**20, 2),
        "last_mb": round(last / 2**20, 2),
        "growth_pct": round((last - first) / first * 100, 3),
        "max_mb": round(max(s["rss_bytes"] for s in warm) / 2**20, 2),
        "samples": len(warm),
    }


def leaks(before: dict[str, Any], after: dict[str, Any], max_threads: int) -> list[str]:
    problems = []
    for key in ("tasks", "fds"):
        if before.get(key) is not None and after.get(key, 0) > before[key]:
            problems.append(f"{key}: {before[key]} idle before, {after[key]} idle after")
    old, new = before.get("fd_kinds") or {}, after.get("fd_kinds") or {}
    grown = {kind: f"{old.get(kind, 0)} -> {n}" for kind, n in new.items() if n > old.get(kind, 0)}
    if grown and after.get("fds", 0) > before.get("fds", 0):
        problems.append(f"fds that grew: {grown}")
    if after.get("threads", 0) > max(before.get("threads", 0), max_threads):
        problems.append(f"threads: {before.get('threads')} before, {after.get('threads')} after")
    if after.get("pool_in_use"):
        problems.append(f"pool buffers still out: {after['pool_in_use']}")
    return problems


def cmd_soak(args: argparse.Namespace) -> int:
    from voxserve.bench.commands import _report  # matplotlib: only when running

    key = args.admin_key or os.environ.get("VOXSERVE_ADMIN_KEY") or secrets.token_hex(12)
    if args.spawn:
        args.server_env += [
            f"VOXSERVE_ADMIN_KEY={key}",
            f"VOXSERVE_TRACEMALLOC_FRAMES={args.tracemalloc}",
        ]
    with _report(args, "soak") as report, target(args, report.out) as tgt:
        return _soak(args, tgt, report.out, key)


def _soak(args: argparse.Namespace, tgt: Target, out: Path, key: str) -> int:
    from voxserve.bench.commands import ramp_seconds, stream_step

    program = audio_program(args, tgt)
    # A connection per request: one kept alive is a socket of the server's at the next
    # sample, counted as a leak unless the server's keep-alive timeout (5 s) had closed it.
    headers = {"Authorization": f"Bearer {key}", "Connection": "close"}
    with httpx.Client(base_url=tgt.http, headers=headers, timeout=30) as client:
        if "error" in _get(client, "/debug/memory"):
            raise RuntimeError("GET /debug/memory failed: is the admin key right?")
        warm_up = argparse.Namespace(**{**vars(args), "duration": WARMUP_S, "ramp": 0.0})
        stream_step(warm_up, tgt, program, 2, "soak warm-up")
        time.sleep(SETTLE_S)
        before = server_sample(client, tgt.pid)
        begin = time.monotonic()
        load_s = ramp_seconds(args) + args.duration
        sampler = Sampler(
            client,
            tgt.pid,
            args.sample_every,
            baseline_at=begin + ramp_seconds(args) + args.warmup,
            diff_at=begin + load_s - 2 * args.sample_every,
        )
        sampler.start()
        step = stream_step(args, tgt, program, args.streams, f"soak {args.streams} streams")
        sampler.stop()
        after = settled_sample(client, tgt.pid, before, args.max_threads)
    growth = rss_growth(sampler.samples, load_s)
    problems = leaks(before, after, args.max_threads)
    if "growth_pct" in growth and growth["growth_pct"] >= args.max_rss_growth:
        problems.append(f"RSS grew {growth['growth_pct']}% after warm-up")
    if "error" in growth:
        problems.append(str(growth["error"]))
    summary = {
        "command": "soak",
        "streams": args.streams,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "session_s": args.session_s,
        "sessions": step.record["counts"].get("sessions"),
        "churned_streams": step.record["counts"].get("churned_streams", 0),
        "rss_growth": growth,
        "idle_before": before,
        "idle_after": after,
        "tracemalloc": sampler.tracemalloc,
        "load": step.record,
        "problems": problems,
        "pass": not problems,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(summary, indent=2, default=str))
    (out / "soak-samples.jsonl").write_text(
        "".join(json.dumps(sample) + "\n" for sample in sampler.samples)
    )
    (out / "soak.md").write_text(soak_markdown(summary))
    print(soak_markdown(summary))
    eprint(f"bench: wrote {out / 'soak.json'}")
    return 0 if not problems else 1


def soak_markdown(summary: dict[str, Any]) -> str:
    growth = summary["rss_growth"]
    before, after = summary["idle_before"], summary["idle_after"]
    lines = [
        f"# soak: {summary['streams']} streams, {summary['duration_s']:g} s "
        f"(warm-up {summary['warmup_s']:g} s): {'PASS' if summary['pass'] else 'FAIL'}",
        "",
        f"sessions: {summary['sessions']}"
        + (
            f" (a new one every {summary['session_s']:g} s; {summary['churned_streams']} of "
            f"{summary['streams']} streams held more than one)"
            if summary["session_s"]
            else ""
        ),
        "",
        f"RSS after warm-up: {growth.get('first_mb')} MB -> {growth.get('last_mb')} MB "
        f"({growth.get('growth_pct')}%), max {growth.get('max_mb')} MB, "
        f"{growth.get('samples')} samples",
        "",
        "| idle | RSS MB | tasks | threads | fds |",
        "|---|---|---|---|---|",
    ]
    for name, s in (("before the load", before), ("after the load", after)):
        rss = round(s.get("rss_bytes", 0) / 2**20, 1)
        lines.append(f"| {name} | {rss} | {s.get('tasks')} | {s.get('threads')} | {s.get('fds')} |")
    trace = summary.get("tracemalloc") or {}
    if trace.get("top"):
        lines += [
            "",
            f"tracemalloc, warm-up -> end of load: total {trace.get('total_diff_bytes')} B",
            "",
        ]
        lines += ["| where | size diff B | count diff |", "|---|---|---|"]
        for row in trace["top"]:
            lines.append(f"| {row['where']} | {row['size_diff_bytes']} | {row['count_diff']} |")
    elif trace:
        lines += ["", f"tracemalloc: {trace}"]
    if summary["problems"]:
        lines += ["", "Problems:", *[f"- {p}" for p in summary["problems"]]]
    return "\n".join(lines) + "\n"


def add_soak_arguments(soak: argparse.ArgumentParser) -> None:
    soak.add_argument("--warmup", type=float, default=60.0, help="seconds before the baseline")
    soak.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples")
    soak.add_argument(
        "--max-rss-growth", type=float, default=2.0, help="percent allowed after warm-up"
    )
    soak.add_argument(
        "--max-threads", type=int, default=12, help="threads allowed idle after the load"
    )
    soak.add_argument(
        "--tracemalloc", type=int, default=1, help="frames per trace for --spawn (0 = off)"
    )
    soak.add_argument("--admin-key", help="admin key (default: VOXSERVE_ADMIN_KEY)")
    soak.add_argument(
        "--session-s",
        type=float,
        default=0.0,
        help="session churn: each stream reconnects as a new session every this many "
        "seconds (default: one session per stream for the whole run)",
    )

"""Memory per stream and per worker, read from /proc/PID/smaps_rollup (RSS, PSS, USS).

    voxserve bench stream-memory ...   RSS per idle connected stream and per active stream
    voxserve bench worker-memory ...   RSS/PSS/USS of `serve --workers N` for each N

PSS (each shared page divided among the processes sharing it) and USS (private pages) are
the honest figures with worker processes: RSS counts every shared page in every process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from voxserve.bench.report import eprint
from voxserve.observe.process_memory import smaps_rollup

AddCommand = Callable[..., argparse.ArgumentParser]


def add_memory_parsers(add: AddCommand, streams: argparse.ArgumentParser) -> None:
    per_stream = add(
        "stream-memory",
        "voxserve.bench.memory:cmd_stream_memory",
        "server memory per idle connected stream (--idle N) and per active stream (--streams)",
        streams,
    )
    per_stream.add_argument("--idle", type=int, default=200, help="idle sessions to open")
    workers = add(
        "worker-memory",
        "voxserve.bench.memory:cmd_worker_memory",
        "RSS/PSS/USS of a spawned `serve --workers N` (parent + workers), for each N",
    )
    workers.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    workers.add_argument("--settle", type=float, default=3.0, help="seconds after ready")


def _mb(value: float) -> float:
    return round(value / 2**20, 2)


async def _open_idle(url: str, count: int) -> list[Any]:
    from websockets.asyncio.client import connect

    sockets = []
    for _ in range(count):
        ws = await connect(url, compression=None)
        await ws.send(json.dumps({"type": "session.start", "mode": "asr"}))
        started = json.loads(await ws.recv())
        if started.get("type") != "session.started":
            raise RuntimeError(f"session refused: {started}")
        sockets.append(ws)
    return sockets


async def _idle_figures(url: str, pid: int, count: int) -> dict[str, Any]:
    for ws in await _open_idle(url, 1):  # the first session builds what every session shares
        await ws.close()
    await asyncio.sleep(1.0)
    before = smaps_rollup(pid)
    sockets = await _open_idle(url, count)
    await asyncio.sleep(2.0)
    during = smaps_rollup(pid)
    for ws in sockets:
        await ws.close()
    await asyncio.sleep(2.0)
    after = smaps_rollup(pid)
    return {
        "idle_sessions": count,
        "rss_mb_before": _mb(before["rss_bytes"]),
        "rss_mb_with_idle": _mb(during["rss_bytes"]),
        "rss_mb_after_close": _mb(after["rss_bytes"]),
        "rss_kb_per_idle_stream": round(
            (during["rss_bytes"] - before["rss_bytes"]) / count / 1024, 1
        ),
        "uss_kb_per_idle_stream": round(
            (during["uss_bytes"] - before["uss_bytes"]) / count / 1024, 1
        ),
    }


def cmd_stream_memory(args: argparse.Namespace) -> int:
    from voxserve.bench.commands import _report, stream_step
    from voxserve.bench.target import audio_program, target

    with _report(args, "stream-memory") as report, target(args, report.out) as tgt:
        if tgt.pid is None:
            raise RuntimeError("the server process is needed (--spawn or a local --url)")
        figures = asyncio.run(_idle_figures(tgt.url, tgt.pid, args.idle))
        base = smaps_rollup(tgt.pid)["rss_bytes"]
        step = stream_step(args, tgt, audio_program(args, tgt), args.streams, "active")
        server = step.record.get("server") or {}
        peak = server.get("rss_mb_max")
        if peak is not None:
            figures["active_streams"] = args.streams
            figures["rss_mb_idle_server"] = _mb(base)
            figures["rss_mb_active_max"] = peak
            figures["rss_kb_per_active_stream"] = round(
                (peak * 2**20 - base) / args.streams / 1024, 1
            )
            figures["active_mark_lag_p99_ms"] = (
                step.record.get("latency_ms", {}).get("mark_lag", {}).get("p99")
            )
    _write(Path(args.out), "stream-memory", figures)
    return 0


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def cmd_worker_memory(args: argparse.Namespace) -> int:
    from voxserve.bench.servers import spawn_voxserve

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for count in [int(x) for x in args.workers.split(",") if x.strip()]:
        env = dict(item.split("=", 1) for item in args.server_env)
        env["VOXSERVE_WORKERS"] = str(count)
        with spawn_voxserve(out / f"server-{count}.log", args.server_config, env) as spawned:
            deadline = time.monotonic() + 60
            while count > 1 and len(children(spawned.pid)) < count:
                if time.monotonic() > deadline:
                    raise RuntimeError("workers did not start")
                time.sleep(0.2)
            time.sleep(args.settle)  # every worker loads its own (not fork-safe) engines
            pids = [spawned.pid, *children(spawned.pid)] if count > 1 else [spawned.pid]
            procs = [{"pid": pid, **smaps_rollup(pid)} for pid in pids]
        totals = {
            key: sum(p.get(key, 0) for p in procs)
            for key in ("rss_bytes", "pss_bytes", "uss_bytes")
        }
        rows.append(
            {
                "workers": count,
                "processes": len(procs),
                "rss_mb_total": _mb(totals["rss_bytes"]),
                "pss_mb_total": _mb(totals["pss_bytes"]),
                "uss_mb_total": _mb(totals["uss_bytes"]),
                "per_process": [
                    {
                        "pid": p["pid"],
                        "rss_mb": _mb(p.get("rss_bytes", 0)),
                        "pss_mb": _mb(p.get("pss_bytes", 0)),
                        "uss_mb": _mb(p.get("uss_bytes", 0)),
                    }
                    for p in procs
                ],
            }
        )
        eprint(f"bench: {count} workers: {rows[-1]['pss_mb_total']} MB PSS in all")
    one = next((r for r in rows if r["workers"] == 1), None)
    if one is not None:
        for row in rows:
            row["pss_vs_n_single_servers"] = round(
                row["pss_mb_total"] / (one["pss_mb_total"] * row["workers"]), 3
            )
    _write(out, "worker-memory", {"rows": rows})
    return 0


def _write(out: Path, name: str, body: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(body, indent=2))
    print(json.dumps(body, indent=2))
    eprint(f"bench: wrote {out / (name + '.json')}")

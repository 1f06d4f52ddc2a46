"""Several load processes for one step: one core cannot pace thousands of streams.

Each worker is a fresh (spawned) process that imports the job, says it is ready, gets the
common start time (CLOCK_MONOTONIC is one clock for the machine), runs, and sends back its
`Raw`. A worker that does not finish in time is killed and counted as an error: every run
stops by itself.

A worker's heap is collected and frozen before it says it is ready (as the server's is:
observe/gc_control.py): its imports leave ~42,000 objects that every full collection would
walk, and one such collection during a step stalled the worker's sends 9-24 ms, enough for
a short step's P99 send lateness to pass the 10 ms the verdict allows (a flaky smoke test).
Frozen, no full collection ran during a step and the others took <= 0.4 ms.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from voxserve.bench.records import Raw, merged

S = TypeVar("S")
Job = Callable[[S, float], Raw]
START_MARGIN_S = 0.3  # between "all ready" and the start, for the start message to arrive
READY_TIMEOUT_S = 60.0


def settle_heap() -> None:
    """What is allocated so far is kept for good: later collections do not walk it."""
    gc.collect()
    gc.freeze()


def _worker(job: Job[Any], spec: Any, conn: Connection) -> None:
    settle_heap()
    try:
        conn.send("ready")
        start_at = conn.recv()
        conn.send(job(spec, start_at))
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        pass
    finally:
        conn.close()


def run_jobs(
    job: Job[S],
    specs: Sequence[S],
    *,
    run_s: float,
    on_start: Callable[[float], None],
    inline: bool = False,
) -> Raw:
    """Run job(spec, start_at) for every spec, each in its own process (or here when
    `inline` and there is one spec), and merge the results. `run_s` bounds the run."""
    if inline and len(specs) == 1:
        settle_heap()
        start_at = time.monotonic() + START_MARGIN_S
        on_start(start_at)
        return job(specs[0], start_at)
    ctx = mp.get_context("spawn")
    procs: list[tuple[Any, Connection]] = []
    for spec in specs:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(job, spec, child), daemon=True)
        proc.start()
        child.close()
        procs.append((proc, parent))
    try:
        return _collect(procs, run_s, on_start)
    finally:
        for proc, conn in procs:
            conn.close()
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2)


def _collect(
    procs: list[tuple[Any, Connection]], run_s: float, on_start: Callable[[float], None]
) -> Raw:
    failed = Raw()
    ready_by = time.monotonic() + READY_TIMEOUT_S
    for proc, conn in procs:
        if not conn.poll(max(0.0, ready_by - time.monotonic())):
            raise RuntimeError(f"load worker {proc.pid} did not start")
        conn.recv()
    start_at = time.monotonic() + START_MARGIN_S
    for _, conn in procs:
        conn.send(start_at)
    on_start(start_at)
    deadline = start_at + run_s
    parts: list[Raw] = []
    for _, conn in procs:
        try:
            if conn.poll(max(0.0, deadline - time.monotonic())):
                parts.append(conn.recv())
                continue
        except EOFError:
            pass
        failed.errors["worker_lost"] += 1
    return merged([*parts, failed])

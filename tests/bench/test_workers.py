"""The load workers: a step's sender is not stalled by a full collection of its imports."""

from __future__ import annotations

import gc

from voxserve.bench.records import Raw
from voxserve.bench.workers import run_jobs


def frozen_objects(spec: int, start_at: float) -> Raw:
    """A job: how many objects the worker's collector no longer walks."""
    raw = Raw()
    raw.counts["frozen"] = gc.get_freeze_count()
    return raw


def test_a_worker_freezes_its_heap_before_it_says_it_is_ready() -> None:
    """Each spawned worker (and an inline run) collects and freezes what its imports made
    before the step starts: without it, one full collection of ~42,000 objects stalled a
    worker's sends 9-24 ms mid-step (bench/workers.py)."""
    starts: list[float] = []
    raw = run_jobs(frozen_objects, [0, 1], run_s=60, on_start=starts.append)
    assert len(starts) == 1
    assert raw.counts["frozen"] > 2 * 10_000  # two workers, each its imports frozen
    inline = run_jobs(frozen_objects, [0], run_s=60, on_start=starts.append, inline=True)
    assert inline.counts["frozen"] > 10_000
    gc.unfreeze()  # this test process's heap as it was

"""The soak's sampler keeps its clock while the server is slow to answer a tracemalloc
call (a busy server takes seconds): RSS growth is judged on the samples it takes, and a
blocked sampler left too few of them ("too few warm samples" on a loaded machine)."""

from __future__ import annotations

import threading
import time

import httpx

from voxserve.bench.soak import Sampler


def test_a_slow_tracemalloc_snapshot_does_not_thin_the_samples() -> None:
    answered = threading.Event()

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/debug/tracemalloc/snapshot":
            time.sleep(1.5)  # the snapshot of a big heap on a loaded machine
            return httpx.Response(200, json={"snapshot": True})
        if request.url.path == "/debug/tracemalloc":
            answered.set()
            return httpx.Response(200, json={"top": ["a line"]})
        return httpx.Response(200, json={"rss_bytes": 100, "tasks": 3, "sessions_active": 0})

    with httpx.Client(base_url="http://stand-in", transport=httpx.MockTransport(server)) as client:
        begin = time.monotonic()
        sampler = Sampler(client, None, 0.1, baseline_at=begin + 0.2, diff_at=begin + 1.0)
        sampler.start()
        time.sleep(2.2)
        sampler.stop()
    warm = [s for s in sampler.samples if s["warm"]]
    # ~20 samples on a 0.1 s clock after the baseline in ~2 s; blocked by the snapshot: ~6
    assert len(warm) >= 12, [s["t"] for s in sampler.samples]
    assert answered.is_set() and sampler.tracemalloc == {"top": ["a line"]}  # after the baseline

"""Garbage-collector pauses as a histogram, voxserve_gc_pause_seconds{generation}.

A full collection stops the event loop of every session at once, so its pauses belong next
to the loop lag. gc.callbacks is process-wide: the timer is installed once per process
(idempotent) and each Metrics registry exposes the same histogram through a collector.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

GC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)

_registry = CollectorRegistry(auto_describe=True)
_pauses = Histogram(
    "voxserve_gc_pause_seconds",
    "Garbage collection pauses (the event loop is stopped meanwhile), by generation",
    ["generation"],
    buckets=GC_BUCKETS,
    registry=_registry,
)
_children = [_pauses.labels(str(generation)) for generation in range(3)]
_lock = threading.Lock()
_installed = False
_started = threading.local()


def _callback(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started.at = time.perf_counter()
        return
    began = getattr(_started, "at", None)
    if began is None:
        return
    _started.at = None
    generation = int(info.get("generation", 2))
    _children[min(max(generation, 0), 2)].observe(time.perf_counter() - began)


def install() -> None:
    """Start timing collections (once per process; later calls do nothing)."""
    global _installed
    with _lock:
        if not _installed:
            gc.callbacks.append(_callback)
            _installed = True


class GcCollector(Collector):
    """Exposes the process-wide GC histogram in one Metrics registry."""

    def collect(self) -> Iterator[Metric]:
        yield from _pauses.collect()

"""Prometheus metrics for one process. Children are created once and cached; nothing here is
called per frame (frame counters are added once per session, at its end)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from voxserve.observe.cache_metrics import TtsCacheCollector

if TYPE_CHECKING:
    from voxserve.runtime import Runtime

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2.5, 5, 10)
# Cache hits answer in well under a millisecond; misses in tenths of a second.
FIRST_AUDIO_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 1, 2.5)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_active = Gauge(
            "voxserve_sessions_active", "Open sessions", ["mode"], registry=r
        )
        self.sessions_total = Counter(
            "voxserve_sessions_total", "Sessions started", ["mode"], registry=r
        )
        self.frames = Counter(
            "voxserve_frames_total", "Audio frames by outcome", ["outcome"], registry=r
        )
        self.stage_latency = Histogram(
            "voxserve_stage_latency_seconds",
            "Time per engine call, queueing included",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "voxserve_errors_total", "Errors sent to clients", ["code", "transport"], registry=r
        )
        self.refused = Counter(
            "voxserve_sessions_refused_total", "Sessions refused", ["reason"], registry=r
        )
        self.first_audio = Histogram(
            "voxserve_tts_first_audio_seconds",
            "Time from a synthesis request to its first audio chunk, by source (hit: from the "
            "cache; miss: started a synthesis; joined: shared one already in progress)",
            ["source"],
            buckets=FIRST_AUDIO_BUCKETS,
            registry=r,
        )
        self._stage_children: dict[str, Histogram] = {}
        self._first_audio_children: dict[str, Histogram] = {}

    def observe_first_audio(self, source: str, seconds: float) -> None:
        child = self._first_audio_children.get(source)
        if child is None:
            child = self._first_audio_children[source] = self.first_audio.labels(source)
        child.observe(seconds)

    def observe_stage(self, stage: str, seconds: float) -> None:
        child = self._stage_children.get(stage)
        if child is None:
            child = self._stage_children[stage] = self.stage_latency.labels(stage)
        child.observe(seconds)

    def session_counts(self, ended: dict[str, object]) -> None:
        for outcome in ("received", "duplicates", "processed", "dropped", "rejected"):
            value = ended.get(outcome, 0)
            if isinstance(value, int) and value:
                self.frames.labels(outcome).inc(value)

    def watch(self, runtime: Runtime) -> None:
        """Expose live state (stage queues, executor, TTS cache) read at scrape time."""
        self.registry.register(_RuntimeCollector(runtime))
        self.registry.register(TtsCacheCollector(runtime))


class _RuntimeCollector(Collector):
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[GaugeMetricFamily]:
        waiting = GaugeMetricFamily(
            "voxserve_stage_queue_length", "Calls waiting for a stage slot", labels=["stage"]
        )
        running = GaugeMetricFamily("voxserve_stage_in_use", "Stage slots in use", labels=["stage"])
        for name, stage in list(self.runtime.stages.items()):
            waiting.add_metric([name], stage.waiting)
            running.add_metric([name], stage.running)
        yield waiting
        yield running
        stats = self.runtime.executor.stats
        yield GaugeMetricFamily("voxserve_executor_workers", "Executor threads", stats.workers)
        yield GaugeMetricFamily(
            "voxserve_executor_queued", "Calls queued on the executor", stats.queued
        )
        yield GaugeMetricFamily(
            "voxserve_ready", "1 once every engine is loaded", 1 if self.runtime.ready else 0
        )
        try:
            tasks = len(asyncio.all_tasks())
        except RuntimeError:
            tasks = 0
        yield GaugeMetricFamily("voxserve_asyncio_tasks", "Tasks on the event loop", tasks)

"""Prometheus metrics for one process. Children are created once and cached; nothing here is
called per frame (frame counters are added once per session, at its end), except a WebRTC
call's outgoing frame lag (`observe_frame_lag`), which is the frame's own timing.

`Metrics(enabled=False)` (settings.metrics_enabled = false) turns the per-session and
per-stage observations off, to measure what they cost (docs/benchmarks.md); counters of
sessions, errors and refusals and the scrape-time gauges stay on.

Server-side latency definitions (the server cannot know when the user spoke):
time to first partial runs from `vad.start` sent to the segment's first `transcript.partial`
sent; final latency from `vad.end` sent to `transcript.final` sent; assistant turn latency
from `vad.end` sent to the first reply audio chunk sent.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from voxserve.events import SessionEnded
from voxserve.observe import gc_metrics
from voxserve.observe.cache_metrics import TtsCacheCollector
from voxserve.observe.flow_metrics import FlowCollector
from voxserve.observe.process_memory import memory_limit_bytes, rss_bytes
from voxserve.observe.profiler import StageProfiler
from voxserve.observe.sources import Watched

if TYPE_CHECKING:
    from voxserve.audio.ring import SampleRing

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
FIRST_AUDIO_SOURCES = ("hit", "miss", "joined")
WORK_CLASSES = ("live", "bulk")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2.5, 5, 10)
# Most calls find a free slot (microseconds); a loaded stage queues for up to its timeout.
QUEUE_WAIT_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
# Cache hits answer in well under a millisecond; misses in tenths of a second.
PREDICTED_WAIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.8, 1, 1.5, 2, 3, 5, 10)
FIRST_AUDIO_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 1, 2.5)
# Chunks of one reply follow each other within milliseconds unless TTS falls behind.
GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 1, 2.5)
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
# A call's outgoing frames are due every 20 ms: the 20 ms edge is the bench's budget.
FRAME_LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.1, 0.2)


class Metrics:
    def __init__(self, *, enabled: bool = True, profile_window: int = 2048) -> None:
        self.enabled = enabled
        self.registry = CollectorRegistry()
        self.profiler = StageProfiler(profile_window)
        self.rings: weakref.WeakSet[SampleRing] = weakref.WeakSet()
        r = self.registry
        self.sessions_active = Gauge(
            "voxserve_sessions_active", "Open sessions", ["mode", "transport"], registry=r
        )
        self.sessions_total = Counter(
            "voxserve_sessions_total", "Sessions started", ["mode", "transport"], registry=r
        )
        self.frames = Counter(
            "voxserve_frames_total", "Audio frames by outcome", ["outcome"], registry=r
        )
        self.ws_audio_messages = Counter(
            "voxserve_ws_audio_messages_total",
            "WebSocket audio messages by path: taken in the socket's parser (direct) or "
            "through the ASGI queue (queued); counted when the connection ends",
            ["path"],
            registry=r,
        )
        self.ws_events_direct = Counter(
            "voxserve_ws_events_direct_total",
            "WebSocket events written straight to the transport by the protocol instead of "
            "through the ASGI send (server/websocket/fastpath.py); "
            "counted when the connection ends",
            registry=r,
        )
        self.ws_frames_split = Counter(
            "voxserve_ws_frames_split_total",
            "WebSocket binary messages framed by voxserve's own frame splitter instead of "
            "websockets' parser (server/websocket/fastpath.py); counted when the connection ends",
            registry=r,
        )
        self.webrtc_packets_lost = Counter(
            "voxserve_webrtc_packets_lost_total",
            "RTP packets of WebRTC callers' audio that never came (server/webrtc/inbound.py); "
            "counted when the call ends",
            registry=r,
        )
        self.webrtc_concealed = Counter(
            "voxserve_webrtc_concealed_seconds_total",
            "Audio that stood in for WebRTC callers' lost packets (loss concealment); counted "
            "when the call ends",
            registry=r,
        )
        self.stage_latency = Histogram(
            "voxserve_stage_latency_seconds",
            "Time per engine call, queueing included, by stage and work class (live: a "
            "session someone is talking to; bulk: an upload, a one-shot synthesis over HTTP, "
            "gRPC or Wyoming, prewarm: pipeline/scheduling/stage.py)",
            ["stage", "work_class"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_queue_wait = Histogram(
            "voxserve_stage_queue_wait_seconds",
            "Time per engine call spent waiting for a stage slot (all of it when the call "
            "timed out waiting), by stage and work class",
            ["stage", "work_class"],
            buckets=QUEUE_WAIT_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "voxserve_errors_total", "Errors sent to clients", ["code", "transport"], registry=r
        )
        self.http_closed = Counter(
            "voxserve_http_connections_closed_total",
            "HTTP connections the server closed for a connection limit (server/http/protocol.py): "
            "header_timeout, evicted (closed to make room at limits.max_connections), refused "
            "(over it, nothing to evict), unread_response (the client read none of the response "
            "for limits.stalled_client_s)",
            ["reason"],
            registry=r,
        )
        self.refused = Counter(
            "voxserve_sessions_refused_total", "Sessions refused", ["reason"], registry=r
        )
        self.quota_refusals = Counter(
            "voxserve_quota_refusals_total",
            "Requests, sessions or audio refused by a per-key quota (kind: sessions, "
            "requests, audio)",
            ["kind"],
            registry=r,
        )
        self.first_audio = Histogram(
            "voxserve_tts_first_audio_seconds",
            "Time from a synthesis request to its first audio chunk, by source (hit: from the "
            "cache; miss: started a synthesis; joined: shared one already in progress) and "
            "work class (live: a session's reply; bulk: one-shot speech over HTTP, gRPC, "
            "Wyoming)",
            ["source", "work_class"],
            buckets=FIRST_AUDIO_BUCKETS,
            registry=r,
        )
        self.tts_predicted_wait = Histogram(
            "voxserve_tts_predicted_wait_seconds",
            "Predicted wait for a TTS slot of each new synthesis at admission (the work ahead "
            "of its first clause in EDF order over the slots: pipeline/scheduling/tts_lateness.py)",
            buckets=PREDICTED_WAIT_BUCKETS,
            registry=r,
        )
        self.tts_predicted_first_audio = Histogram(
            "voxserve_tts_predicted_first_audio_seconds",
            "Predicted first audio of each new synthesis at admission (wait + its first "
            "clause); over tts.degrade.first_audio_budget_ms it is refused (reason late)",
            buckets=PREDICTED_WAIT_BUCKETS,
            registry=r,
        )
        self.first_partial = Histogram(
            "voxserve_asr_first_partial_seconds",
            "Server-side time to first partial: from vad.start sent to the segment's first "
            "transcript.partial sent",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.final_latency = Histogram(
            "voxserve_asr_final_latency_seconds",
            "From vad.end sent to transcript.final sent",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.turn_latency = Histogram(
            "voxserve_turn_latency_seconds",
            "Assistant turn latency: from vad.end sent (user stopped) to the first reply "
            "audio chunk sent",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.chunk_gap = Histogram(
            "voxserve_tts_chunk_gap_seconds",
            "Time between consecutive audio chunks of one reply",
            buckets=GAP_BUCKETS,
            registry=r,
        )
        self.loop_stalls = Counter(
            "voxserve_event_loop_stalls",
            "Times the event loop did not run for longer than the watchdog threshold",
            registry=r,
        )
        self.loop_lag = Histogram(
            "voxserve_event_loop_lag_seconds",
            "How late the loop's heartbeat woke up (time the loop was busy or blocked)",
            buckets=LOOP_LAG_BUCKETS,
            registry=r,
        )
        self.webrtc_frame_lag = Histogram(
            "voxserve_webrtc_frame_lag_seconds",
            "How late each 20 ms frame of a call's outgoing track was handed to the encoder "
            "after its due time (0 when on time)",
            buckets=FRAME_LAG_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "voxserve_engine_batch_size",
            "Requests run together in one engine call by a cross-session batcher",
            ["engine"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.shed = Counter(
            "voxserve_admission_shed_total",
            "Sessions and requests refused because a model stage stayed under pressure "
            "(flow.shed_after_s)",
            ["stage"],
            registry=r,
        )
        self.speculative_cancelled = Counter(
            "voxserve_speculative_cancelled_total",
            "Speculative finals and replies started at a pause and dropped because the user "
            "went on speaking",
            registry=r,
        )
        self.underruns = Counter(
            "voxserve_tts_underruns_total",
            "Reply audio chunks sent after the client's playback had already run dry",
            registry=r,
        )
        self.engine_reloads = Counter(
            "voxserve_engine_reloads_total",
            "Hot engine reloads (admin route, CLI, SIGHUP), by outcome (ok, failed)",
            ["outcome"],
            registry=r,
        )
        gc_metrics.install()
        r.register(gc_metrics.GcCollector())
        self._batch_children: dict[str, Histogram] = {}
        self._stage_children: dict[tuple[str, str], tuple[Histogram, Histogram]] = {}
        self._first_audio_children: dict[tuple[str, str], Histogram] = {}
        if enabled:  # made now, not by a first request (a child costs ~ms to make)
            for source in FIRST_AUDIO_SOURCES:
                for work_class in WORK_CLASSES:
                    child = self.first_audio.labels(source, work_class)
                    self._first_audio_children[(source, work_class)] = child

    def observe_tts_prediction(self, wait_s: float, first_audio_s: float) -> None:
        if self.enabled:
            self.tts_predicted_wait.observe(wait_s)
            self.tts_predicted_first_audio.observe(first_audio_s)

    def observe_first_audio(self, source: str, seconds: float, work_class: str = "live") -> None:
        """`work_class`: live (a session's reply) or bulk (one-shot: HTTP, gRPC, Wyoming)."""
        if not self.enabled:
            return
        key = (source, work_class)
        child = self._first_audio_children.get(key)
        if child is None:
            child = self._first_audio_children[key] = self.first_audio.labels(source, work_class)
        child.observe(seconds)
        self.profiler.observe("tts_first_audio", seconds)

    def observe_stage(
        self, stage: str, work_class: str, seconds: float, waited_s: float | None = None
    ) -> None:
        """One engine call: its whole time and (a stage's call) its wait for a slot."""
        if not self.enabled:
            return
        key = (stage, work_class)
        children = self._stage_children.get(key)
        if children is None:
            children = self._stage_children[key] = (
                self.stage_latency.labels(stage, work_class),
                self.stage_queue_wait.labels(stage, work_class),
            )
        children[0].observe(seconds)
        if waited_s is not None:
            children[1].observe(waited_s)
        self.profiler.observe(stage if work_class == "live" else f"{stage}_{work_class}", seconds)

    def observe_first_partial(self, seconds: float) -> None:
        if self.enabled:
            self.first_partial.observe(seconds)
            self.profiler.observe("asr_first_partial", seconds)

    def observe_final(self, seconds: float) -> None:
        if self.enabled:
            self.final_latency.observe(seconds)
            self.profiler.observe("asr_final", seconds)

    def observe_turn(self, seconds: float) -> None:
        if self.enabled:
            self.turn_latency.observe(seconds)
            self.profiler.observe("turn", seconds)

    def observe_batch(self, engine: str, size: int) -> None:
        if not self.enabled:
            return
        child = self._batch_children.get(engine)
        if child is None:
            child = self._batch_children[engine] = self.batch_size.labels(engine)
        child.observe(size)

    def observe_frame_lag(self, seconds: float) -> None:
        """One outgoing WebRTC frame's lateness: the one per-frame observation here (about
        a microsecond, 50 a second per call, next to the frame's Opus encode)."""
        if self.enabled:
            self.webrtc_frame_lag.observe(seconds)

    def observe_chunk_gap(self, seconds: float) -> None:
        if self.enabled:
            self.chunk_gap.observe(seconds)

    def track_ring(self, ring: SampleRing) -> None:
        """Count a session's sample ring in voxserve_ring_fill_max_ratio (weakly held)."""
        self.rings.add(ring)

    def session_counts(self, ended: SessionEnded) -> None:
        """A finished session's audio messages by outcome (voxserve_frames_total)."""
        for outcome, value in (
            ("received", ended.received),
            ("duplicates", ended.duplicates),
            ("processed", ended.processed),
            ("dropped", ended.dropped),
            ("rejected", ended.rejected),
        ):
            if value:
                self.frames.labels(outcome).inc(value)

    def watch(self, state: Watched) -> None:
        """Expose live state (stage queues, executor, TTS cache) read at scrape time."""
        self.registry.register(_RuntimeCollector(state, self.rings))
        self.registry.register(TtsCacheCollector(state))
        self.registry.register(FlowCollector(state))


class _RuntimeCollector(Collector):
    def __init__(self, state: Watched, rings: weakref.WeakSet[SampleRing]) -> None:
        self.state = state
        self.rings = rings

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        waiting = GaugeMetricFamily(
            "voxserve_stage_queue_length", "Calls waiting for a stage slot", labels=["stage"]
        )
        running = GaugeMetricFamily("voxserve_stage_in_use", "Stage slots in use", labels=["stage"])
        inline = CounterMetricFamily(
            "voxserve_stage_inline_calls",
            "Engine calls run on the event loop, cheaper than a thread hop "
            "(pipeline/scheduling/stage.py)",
            labels=["stage"],
        )
        bulk_waiting = GaugeMetricFamily(
            "voxserve_stage_bulk_queue_length",
            "Bulk calls (uploads' windows, one-shot synthesis) among those waiting",
            labels=["stage"],
        )
        bulk_running = GaugeMetricFamily(
            "voxserve_stage_bulk_in_use",
            "Stage slots held by bulk calls (at most pipeline.<stage>.bulk_slots)",
            labels=["stage"],
        )
        refused_late = CounterMetricFamily(
            "voxserve_stage_refused_late",
            "One-shot requests refused at once as predicted past their budget "
            "(asr: pipeline/recognition/bulk.py; TTS counts its own: "
            'voxserve_tts_refusals_total{reason="late"})',
            labels=["stage"],
        )
        for name, stage in list(self.state.stages.items()):
            refused_late.add_metric([name], stage.refused_late)
            waiting.add_metric([name], stage.waiting)
            running.add_metric([name], stage.running)
            inline.add_metric([name], stage.inline_calls)
            bulk_waiting.add_metric([name], stage.bulk_waiting)
            bulk_running.add_metric([name], stage.bulk_held)
        yield waiting
        yield running
        yield inline
        yield bulk_waiting
        yield bulk_running
        yield refused_late
        stats = self.state.executor.stats
        yield GaugeMetricFamily("voxserve_executor_workers", "Executor threads", stats.workers)
        yield GaugeMetricFamily(
            "voxserve_executor_queued", "Calls queued on the executor", stats.queued
        )
        yield GaugeMetricFamily(
            "voxserve_ready", "1 once every engine is loaded", 1 if self.state.ready else 0
        )
        try:
            tasks = len(asyncio.all_tasks())
        except RuntimeError:
            tasks = 0
        yield GaugeMetricFamily("voxserve_asyncio_tasks", "Tasks on the event loop", tasks)
        fullest = 0.0
        for ring in list(self.rings):
            fullest = max(fullest, len(ring) / ring.capacity)
        yield GaugeMetricFamily(
            "voxserve_ring_fill_max_ratio",
            "Fill ratio of the fullest session sample ring; near 1 the pipeline is not "
            "keeping up and input waits or is dropped",
            fullest,
        )
        pool = self.state.pool
        yield GaugeMetricFamily(
            "voxserve_pool_usage_ratio",
            "Share of the session buffer pool in use (pipeline.pool_buffers, by default "
            "max_sessions x 1.2); at 1 new sessions get buffers outside the pool",
            pool.usage_ratio,
        )
        yield GaugeMetricFamily(
            "voxserve_pool_buffers_in_use", "Session buffers taken from the pool", pool.in_use
        )
        yield CounterMetricFamily(
            "voxserve_pool_fallbacks",
            "Session buffers allocated outside the pool because it was exhausted",
            pool.fallbacks,
        )
        generations = list(self.state.generations)
        yield GaugeMetricFamily(
            "voxserve_engine_generation",
            "Number of the engine generation new sessions use (1 + hot reloads)",
            max((g.number for g in generations if not g.retired), default=0),
        )
        live = GaugeMetricFamily(
            "voxserve_engine_generation_sessions",
            "Sessions per live engine generation (retired ones close when this reaches 0)",
            labels=["generation", "state"],
        )
        for generation in generations:
            state = "retired" if generation.retired else "current"
            live.add_metric([str(generation.number), state], generation.sessions)
        yield live
        yield GaugeMetricFamily(
            "voxserve_process_rss_bytes", "Resident set size of this process", rss_bytes()
        )
        yield GaugeMetricFamily(
            "voxserve_memory_limit_bytes",
            "The cgroup (container) memory limit; 0 when there is none",
            memory_limit_bytes(),
        )
        guard = self.state.memory_guard
        yield GaugeMetricFamily(
            "voxserve_memory_guard_threshold_bytes",
            "Resident set size over which new work is refused `overloaded` "
            "(limits.memory_guard_*); 0 when the guard is off",
            guard.threshold,
        )
        refusals = CounterMetricFamily(
            "voxserve_memory_guard_refusals",
            "New work refused because the process was over its memory threshold, by what: "
            "session, request, synthesis",
            labels=["what"],
        )
        for what in ("session", "request", "synthesis"):
            refusals.add_metric([what], guard.refusals[what])
        yield refusals

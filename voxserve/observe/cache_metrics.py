"""The TTS cache and TTS health as Prometheus metrics, read from their counters at scrape
time: the hot path only bumps plain ints."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from voxserve.observe.sources import HealthState, Watched

_COUNTERS = (
    ("hits", "Synthesis requests served from the cache"),
    ("encoded_hits", "Hits served an encoding kept beside the PCM (HTTP speech: mp3, opus, ...)"),
    ("encoded_stored", "Encodings kept beside their PCM"),
    ("misses", "Synthesis requests that started a synthesis"),
    ("coalesced", "Synthesis requests that joined a synthesis already in progress"),
    ("evictions", "Entries evicted to stay under max_bytes"),
    ("expirations", "Entries dropped at the end of their TTL"),
    ("invalidated", "Entries dropped by an invalidation or a clear"),
    ("not_cached", "Complete replies not stored (empty, too big, invalidated meanwhile)"),
    ("disk_dropped", "Entries not written to disk because the write queue was full"),
    ("disk_errors", "Failed disk write batches"),
)
_PREWARM = (
    ("prewarm_total", "voxserve_tts_cache_prewarm_submitted", "Sentences submitted to prewarm"),
    ("prewarm_done", "voxserve_tts_cache_prewarm_done", "Prewarm sentences processed"),
    ("prewarm_failed", "voxserve_tts_cache_prewarm_failed", "Prewarm sentences that failed"),
)


class TtsCacheCollector(Collector):
    def __init__(self, state: Watched) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        state = self.state
        health = state.tts_health
        stage = state.stages.get("tts")
        degraded = health.reason(stage.live_waiting if stage else 0) is not None
        yield GaugeMetricFamily(
            "voxserve_tts_degraded", "1 while TTS is degraded (only cached speech)", degraded
        )
        yield CounterMetricFamily(
            "voxserve_tts_fallbacks", "Replies that spoke the fallback phrase", health.fallbacks
        )
        yield CounterMetricFamily(
            "voxserve_tts_refused", "Syntheses refused while degraded", health.refused
        )
        yield from _lateness(health)
        cache = state.cache
        if cache is None:
            return
        stats = cache.stats().as_dict()
        for name, doc in _COUNTERS:
            yield CounterMetricFamily(f"voxserve_tts_cache_{name}", doc, stats[name])
        for field, name, doc in _PREWARM:
            yield CounterMetricFamily(name, doc, stats[field])
        gauges = (
            ("hit_ratio", "Hits / lookups since start"),
            ("bytes", "Audio bytes held, encodings included (memory; the disk holds the same)"),
            ("encoded_bytes", "Bytes of encodings held beside their PCM (part of bytes)"),
            ("max_bytes", "The cache's bound in bytes"),
            ("entries", "Entries held"),
            ("disk_bytes", "Size of the cache file and its WAL"),
            ("in_flight", "Syntheses in progress (single flight)"),
        )
        for name, doc in gauges:
            yield GaugeMetricFamily(f"voxserve_tts_cache_{name}", doc, stats[name])


def _lateness(health: HealthState) -> Iterator[Metric]:
    """TTS admission by predicted lateness: its refusals and its inputs."""
    refusals = CounterMetricFamily(
        "voxserve_tts_refusals",
        "Syntheses refused before any audio, by reason (late: predicted to miss the "
        "first-audio budget; behind: a one-shot request that would make admitted streams "
        "pause; queue: the max_waiting backstop; slow: misses slow for sustained_s)",
        labels=["reason"],
    )
    for reason in ("late", "behind", "queue", "slow"):
        refusals.add_metric([reason], health.refusals.get(reason, 0))
    yield refusals
    inputs = health.lateness_inputs()
    yield GaugeMetricFamily(
        "voxserve_tts_predicted_wait_last_seconds",
        "The latest admission's predicted wait for a TTS slot",
        inputs.last_wait_s,
    )
    yield GaugeMetricFamily(
        "voxserve_tts_playback_share",
        "The share of the TTS slots admitted one-shot playback may take (learned: cut when "
        "an admitted stream starves, recovering while none does)",
        inputs.playback_share(),
    )
    yield CounterMetricFamily(
        "voxserve_tts_starved",
        "Admitted one-shot streams whose next chunk came over 0.1 s after their audio ran out",
        inputs.starved,
    )
    yield GaugeMetricFamily(
        "voxserve_tts_syntheses_in_progress",
        "Syntheses admitted and not finished (what admission predicts from)",
        inputs.active,
    )
    rate = GaugeMetricFamily(
        "voxserve_tts_service_ms_per_char",
        "Measured engine time per character (EWMA per engine/voice): the service rate",
        labels=["voice"],
    )
    for key, value in sorted(inputs.ms_per_char.items()):
        rate.add_metric([key], value)
    yield rate

"""Scrape-time gauges of flow control: credit windows per stage, the predicted lateness of
held live work, streams under credit, and the drain."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from voxserve.observe.sources import Watched


class FlowCollector(Collector):
    def __init__(self, state: Watched) -> None:
        self.state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        flow = self.state.flow
        yield _per_stage(
            "voxserve_credit_window",
            "The stage's credit window (chunks in flight per stream; halves under pressure, "
            "grows back by one a tick); new streams start at it",
            {name: window.size for name, window in list(flow.stage_windows.items())},
        )
        yield _per_stage(
            "voxserve_stage_predicted_late_seconds",
            "How late the held live work that fares worst would start, as flow control last "
            "predicted it (stages that predict: ASR finals; 0: on time; above 0: pressure)",
            dict(flow.predicted_late),
        )
        share = self.state.flow.stream_share
        if share is not None:
            yield GaugeMetricFamily(
                "voxserve_asr_stream_share",
                "What one live stream has been costing the ASR engine: its busy share with "
                "finals over the streams in long enough to count (admission's estimate)",
                share,
            )
        yield GaugeMetricFamily(
            "voxserve_credit_streams", "Streams whose input is under a credit window", flow.streams
        )
        yield GaugeMetricFamily(
            "voxserve_draining",
            "1 while the server drains for shutdown",
            1 if self.state.drain.draining else 0,
        )


def _per_stage(name: str, documentation: str, values: Mapping[str, float]) -> GaugeMetricFamily:
    """A gauge with one sample per stage."""
    gauge = GaugeMetricFamily(name, documentation, labels=["stage"])
    for stage, value in values.items():
        gauge.add_metric([stage], value)
    return gauge

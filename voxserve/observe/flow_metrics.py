"""Scrape-time gauges of flow control: credit windows per stage, the predicted lateness of
held live work, streams under credit, and the drain."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from voxserve.observe.sources import Watched


class FlowCollector(Collector):
    def __init__(self, state: Watched) -> None:
        self.state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        flow = self.state.flow
        windows = GaugeMetricFamily(
            "voxserve_credit_window",
            "The stage's credit window (chunks in flight per stream; halves under pressure, "
            "grows back by one a tick); new streams start at it",
            labels=["stage"],
        )
        for name, window in list(flow.stage_windows.items()):
            windows.add_metric([name], window.size)
        yield windows
        late = GaugeMetricFamily(
            "voxserve_stage_predicted_late_seconds",
            "How late the held live work that fares worst would start, as flow control last "
            "predicted it (stages that predict: ASR finals; 0: on time; above 0: pressure)",
            labels=["stage"],
        )
        for name, seconds in list(flow.predicted_late.items()):
            late.add_metric([name], seconds)
        yield late
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

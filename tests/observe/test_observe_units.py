"""Units of voxserve.observe: profiler, metrics switch, GC timer, watchdog, tracing, log flags."""

from __future__ import annotations

import asyncio
import gc
import logging
import subprocess
import sys
import time

import pytest
from prometheus_client import generate_latest

from voxserve.cli.errors import CliError
from voxserve.cli.serve import parse_log_modules
from voxserve.cli.stats import format_table
from voxserve.observe import gc_metrics
from voxserve.observe.loop_watchdog import LoopWatchdog
from voxserve.observe.metrics import Metrics
from voxserve.observe.profiler import StageProfiler
from voxserve.observe.tracing import TurnMarks, make_tracer


def test_profiler_summarises_a_sliding_window() -> None:
    profiler = StageProfiler(window=100)
    for i in range(1, 201):  # only the last 100 (101..200 ms) are kept
        profiler.observe("asr", i / 1000)
    (asr,) = profiler.summary()
    assert asr.count == 100
    assert asr.p50_s == pytest.approx(0.150)
    assert asr.p99_s == pytest.approx(0.199)
    assert asr.max_s == pytest.approx(0.200)
    assert asr.mean_s == pytest.approx(0.1505)
    table = format_table(profiler.as_dict())
    assert "asr" in table and "150.00" in table


def test_disabled_metrics_observe_nothing() -> None:
    metrics = Metrics(enabled=False)
    metrics.observe_stage("asr", "live", 0.1, 0.01)
    metrics.observe_turn(0.2)
    metrics.observe_first_audio("miss", 0.1)
    metrics.observe_frame_lag(0.03)
    text = generate_latest(metrics.registry).decode()
    assert "voxserve_turn_latency_seconds_count 0.0" in text
    assert "voxserve_webrtc_frame_lag_seconds_count 0.0" in text
    assert 'voxserve_stage_latency_seconds_count{stage="asr",work_class="live"}' not in text
    assert "voxserve_stage_queue_wait_seconds_count{" not in text
    assert metrics.profiler.summary() == []
    on = Metrics()
    on.observe_turn(0.2)
    on.observe_frame_lag(0.03)  # a call's frame 30 ms late: over the 20 ms edge
    text = generate_latest(on.registry).decode()
    assert "voxserve_turn_latency_seconds_count 1.0" in text
    assert 'voxserve_webrtc_frame_lag_seconds_bucket{le="0.02"} 0.0' in text
    assert 'voxserve_webrtc_frame_lag_seconds_bucket{le="0.03"} 1.0' in text


def test_gc_timer_is_installed_once() -> None:
    Metrics()
    Metrics()
    gc_metrics.install()
    assert gc.callbacks.count(gc_metrics._callback) == 1


def test_watchdog_logs_the_loop_stack(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()

    async def block() -> int:
        watchdog = LoopWatchdog(metrics.loop_stalls, metrics.loop_lag, threshold_s=0.05)
        watchdog.start()
        await asyncio.sleep(0.1)
        time.sleep(0.3)  # noqa: ASYNC251 - blocking the loop is the point
        await asyncio.sleep(0.1)
        await watchdog.stop()
        return watchdog.stalls

    with caplog.at_level(logging.WARNING, logger="voxserve.observe.loop_watchdog"):
        stalls = asyncio.run(block())
    assert stalls == 1  # one stall, however many checks saw it
    (record,) = [r for r in caplog.records if r.getMessage() == "event loop blocked"]
    assert "time.sleep(0.3)" in record.stack  # type: ignore[attr-defined]
    text = generate_latest(metrics.registry).decode()
    assert "voxserve_event_loop_stalls_total 1.0" in text


def test_tracing_off_imports_nothing() -> None:
    assert make_tracer(False) is None
    code = (
        "import sys; from voxserve.config import Settings; from voxserve.runtime import Runtime; "
        "r = Runtime(Settings()); assert r.tracer is None; "
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_turn_spans_with_the_in_memory_exporter() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from voxserve.observe.tracing import TurnTracer

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    turn = TurnMarks(3)
    for name in (
        "vad.start",
        "vad.end",
        "asr.final",
        "responder.start",
        "tts.start",
        "responder.end",
        "tts.end",
    ):
        turn.mark(name)
    TurnTracer(provider).emit(turn, trace_id="t1", session_id="s1", mode="assistant")
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"voxserve.turn", "vad", "asr", "responder", "tts"}
    root = spans["voxserve.turn"]
    for name in ("vad", "asr", "responder", "tts"):
        assert spans[name].parent is not None
        assert spans[name].parent.span_id == root.context.span_id
    assert root.attributes is not None and root.attributes["voxserve.segment"] == 3


def test_log_module_flags() -> None:
    assert parse_log_modules(["voxserve.pipeline=debug", "uvicorn.access=WARNING"]) == {
        "voxserve.pipeline": "debug",
        "uvicorn.access": "warning",
    }
    with pytest.raises(CliError):
        parse_log_modules(["voxserve.pipeline"])
    with pytest.raises(CliError):
        parse_log_modules(["voxserve=loud"])

"""The metrics move when what they measure happens: real streams through a server with fake
engines, then /metrics, /debug/stats and `voxserve stats`."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeAsr, FakeTts, fake_runtime, silence, tone
from tests.wsclient import collect, send_audio, start
from voxserve.cli.app import main
from voxserve.config import load_settings

ADMIN_KEY = "observe-test-key"


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    settings = load_settings(port=free_port(), log_level="warning", admin_key=SecretStr(ADMIN_KEY))
    # Partials at any pace: the 1 s utterance has one partial's worth of audio, and the pace
    # rule (pipeline/turns/partials.py) rightly skips it when a loaded machine's server judges
    # a stalled stretch at once (CI: no transcript.partial). This module is about the metrics.
    settings = settings.model_copy(
        update={"asr": settings.asr.model_copy(update={"partial_max_speed": 0.0})}
    )
    runtime = fake_runtime(settings, asr=FakeAsr(delay_s=0.01), tts=FakeTts(seconds_per_word=0.5))
    live = start_server(settings, runtime)
    yield live
    stop_server(live)


def scrape(live: LiveServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics by (name, sorted labels)."""
    text = httpx.get(f"{live.http_url}/metrics", timeout=10).text
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def utterance() -> np.ndarray:
    return np.concatenate([silence(0.3), tone(440, 1.0), silence(1.0)])


async def assistant_turn(url: str) -> list[dict[str, object]]:
    async with connect(url) as ws:
        started = await start(ws, mode="assistant")
        assert started["type"] == "session.started", started
        await send_audio(ws, utterance(), speedup=4.0)
        await asyncio.sleep(0.5)  # the reply is spoken before the input ends
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws)
        return events


def test_a_stream_moves_latency_histograms_and_frame_counters(server: LiveServer) -> None:
    before = scrape(server)
    events = asyncio.run(assistant_turn(server.ws_url))
    kinds = [e["type"] for e in events]
    assert "transcript.partial" in kinds and "transcript.final" in kinds and "tts.start" in kinds
    after = scrape(server)
    for name in (
        "voxserve_asr_first_partial_seconds_count",
        "voxserve_asr_final_latency_seconds_count",
        "voxserve_turn_latency_seconds_count",
        "voxserve_tts_chunk_gap_seconds_count",
    ):
        assert value(after, name) > value(before, name), name
    first_audio = sum(
        value(after, "voxserve_tts_first_audio_seconds_count", source=s, work_class="live")
        - value(before, "voxserve_tts_first_audio_seconds_count", source=s, work_class="live")
        for s in ("hit", "miss", "joined")
    )
    assert first_audio >= 1
    for stage in ("vad", "asr", "tts", "responder"):
        name = "voxserve_stage_latency_seconds_count"
        labels = {"stage": stage, "work_class": "live"}
        assert value(after, name, **labels) > value(before, name, **labels), stage
    frames = utterance().size // 320
    received = value(after, "voxserve_frames_total", outcome="received") - value(
        before, "voxserve_frames_total", outcome="received"
    )
    assert received == frames
    # Turn latency is short with instant fake engines: well under a second.
    assert value(after, "voxserve_turn_latency_seconds_sum") < 10
    for name in ("voxserve_process_rss_bytes", "voxserve_executor_workers"):
        assert value(after, name) > 0, name
    assert ("voxserve_pool_usage_ratio", ()) in after


def test_errors_by_code_and_refusals_by_reason(server: LiveServer) -> None:
    async def bad_message() -> None:
        async with connect(server.ws_url) as ws:
            await start(ws, mode="asr")
            await ws.send("not json")
            await ws.send(json.dumps({"type": "audio.end"}))
            await collect(ws)

    async def refused() -> dict[str, object]:
        async with connect(server.ws_url) as ws:
            event: dict[str, object] = json.loads(await ws.recv())  # refused before start
            with contextlib.suppress(websockets.ConnectionClosed):
                await ws.recv()
            return event

    before = scrape(server)
    asyncio.run(bad_message())
    after = scrape(server)
    codes = {
        labels: v - before.get((name, labels), 0.0)
        for (name, labels), v in after.items()
        if name == "voxserve_errors_total" and v > before.get((name, labels), 0.0)
    }
    assert any(dict(labels)["transport"] == "ws" for labels in codes), codes

    runtime = server.runtime
    limits = runtime.settings.limits
    runtime.settings = runtime.settings.model_copy(
        update={"limits": limits.model_copy(update={"max_sessions": 0})}
    )
    try:
        event = asyncio.run(refused())
    finally:
        runtime.settings = runtime.settings.model_copy(update={"limits": limits})
    assert event["type"] == "error" and event["code"] == "overloaded"
    later = scrape(server)
    name = "voxserve_sessions_refused_total"
    assert value(later, name, reason="overloaded") == value(after, name, reason="overloaded") + 1


def test_gc_pauses_are_observed(server: LiveServer) -> None:
    name = "voxserve_gc_pause_seconds_count"
    before = value(scrape(server), name, generation="2")
    gc.collect()
    assert value(scrape(server), name, generation="2") >= before + 1


def test_a_blocked_loop_counts_a_stall(server: LiveServer) -> None:
    watchdog = server.runtime.watchdog
    assert watchdog is not None
    before = value(scrape(server), "voxserve_event_loop_stalls_total")
    task = watchdog._task
    assert task is not None
    task.get_loop().call_soon_threadsafe(time.sleep, 0.4)  # block the server's loop
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and watchdog.stalls == 0:
        time.sleep(0.05)
    after = scrape(server)
    assert value(after, "voxserve_event_loop_stalls_total") >= before + 1
    assert value(after, "voxserve_event_loop_lag_seconds_count") > 0


def test_debug_stats_needs_the_admin_key(server: LiveServer) -> None:
    url = f"{server.http_url}/debug/stats"
    assert httpx.get(url).status_code == 401
    wrong = httpx.get(url, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    asyncio.run(assistant_turn(server.ws_url))
    ok = httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert ok.status_code == 200
    body = ok.json()
    stages = {row["stage"]: row for row in body["stages"]}
    assert {"vad", "asr", "tts", "turn", "asr_final"} <= set(stages)
    row = stages["asr"]
    assert row["count"] >= 1 and row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]


def test_stats_command_prints_a_table(
    server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(assistant_turn(server.ws_url))
    code = main(["stats", "--url", server.http_url, "--admin-key", ADMIN_KEY])
    out = capsys.readouterr().out
    assert code == 0
    assert "p99 ms" in out and "\nasr " in out and "loop stalls" in out
    assert main(["stats", "--url", server.http_url, "--admin-key", "wrong"]) == 1


def test_a_turn_makes_spans_when_tracing_is_on(server: LiveServer) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from voxserve.observe.tracing import TurnTracer

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server.runtime.tracer = TurnTracer(provider)
    try:
        asyncio.run(assistant_turn(server.ws_url))
    finally:
        server.runtime.tracer = None
    names = [span.name for span in exporter.get_finished_spans()]
    assert names.count("voxserve.turn") == 1
    assert {"vad", "asr", "responder", "tts"} <= set(names)
    root = next(s for s in exporter.get_finished_spans() if s.name == "voxserve.turn")
    assert root.attributes is not None and root.attributes["voxserve.mode"] == "assistant"

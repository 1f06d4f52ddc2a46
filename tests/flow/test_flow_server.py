"""Flow control over a real socket with fake engines (these tests are about the pipeline):
credit windows under a slow model stage, load shedding and recovery, a bursty client held
to its window, output paced to playback, output credit and a stalled client, the session
limit, and resume after a dropped connection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import websockets
from websockets.asyncio.client import ClientConnection, connect

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeAsr, FakeTts, FakeVad, fake_runtime, silence, tone
from tests.helpers import eventually
from tests.wsclient import collect, frame_message, of_type, send_audio, start
from voxserve.config import Settings, StageConfig, load_settings
from voxserve.types import FRAME_SAMPLES


def configured(**sections: dict[str, Any]) -> Settings:
    """Test settings with some fields of some sections changed."""
    settings = load_settings(port=free_port(), log_level="warning")
    update = {
        name: getattr(settings, name).model_copy(update=fields) for name, fields in sections.items()
    }
    return settings.model_copy(update=update)


def one_asr_slot(settings: Settings) -> Settings:
    """`settings` with one ASR slot (30 s timeout): a slow fake ASR's finals queue there."""
    pipeline = settings.pipeline.model_copy(
        update={"asr": StageConfig(concurrency=1, timeout_s=30.0)}
    )
    return settings.model_copy(update={"pipeline": pipeline})


@contextlib.contextmanager
def serving(settings: Settings, **engines: Any) -> Iterator[LiveServer]:
    """A live server on fake engines (these tests are about the pipeline)."""
    live = start_server(settings, fake_runtime(settings, **engines))
    try:
        yield live
    finally:
        stop_server(live)


def utterances(count: int, freq: float = 440.0) -> np.ndarray:
    return np.concatenate([np.concatenate([tone(freq, 0.5), silence(0.7)])] * count)


async def refused(url: str) -> tuple[dict[str, Any], int | None, float]:
    """Connect where the server refuses sessions: it says why before any message of the
    client's (error event, close code, seconds taken)."""
    began = time.monotonic()
    async with connect(url) as ws:
        event = json.loads(await asyncio.wait_for(ws.recv(), 5))
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)
        return event, ws.close_code, time.monotonic() - began


# -- input credit under a slow stage ------------------------------------------------------


@pytest.fixture
def slow_asr_server() -> Iterator[LiveServer]:
    # Pressure from the ASR stage only: up to 3 finals wait for its one slot (0.4 s each),
    # more than queue_limit, and for longer than wait_limit_ms. The VAD stage's batched
    # rounds hold at most one call's worth waiting: a limit of 0 let a loaded CI machine
    # see the VAD stage "saturated" first (the refusal then named vad).
    settings = configured(
        flow={"tick_ms": 50, "queue_limit": 1, "wait_limit_ms": 300, "shed_after_s": 0.3},
        pipeline={"asr_batch_enabled": False},
    )
    with serving(one_asr_slot(settings), asr=FakeAsr(0.4)) as live:
        yield live


async def test_slow_stage_shrinks_credit_sheds_new_sessions_and_recovers(
    slow_asr_server: LiveServer,
) -> None:
    url = slow_asr_server.ws_url
    runtime = slow_asr_server.runtime

    async def stream() -> list[dict[str, Any]]:
        async with connect(url) as ws:
            started = await start(ws, mode="asr", partials=False)
            assert started["credit_window"] == 8
            await send_audio(ws, utterances(3), speedup=4)
            await ws.send(json.dumps({"type": "audio.end"}))
            events, _ = await collect(ws, limit_s=60)
            return events

    streams = [asyncio.create_task(stream()) for _ in range(4)]
    # 12 finals of 0.4 s each through one ASR slot: the queue stays long for seconds.
    await eventually(lambda: runtime.flow.overloaded() is not None, 20)
    event, code, took = await refused(url)
    assert event["code"] == "overloaded" and "asr" in event["message"]
    assert event["retry_after_ms"] == 2000 and code == 1013 and took < 1.0
    results = await asyncio.gather(*streams)
    for events in results:
        assert len(of_type(events, "transcript.final")) == 3  # admitted streams finish
        windows = [e["window"] for e in of_type(events, "credit")]
        assert windows and min(windows) < 8, windows  # told to slow down
        ended = events[-1]
        assert ended["type"] == "session.ended" and ended["processed"] == ended["received"]
    assert runtime.stages["asr"].waiting == 0
    # No pressure: the window grows back, admission opens.
    await eventually(
        lambda: runtime.flow.stage_windows["asr"].size == 8 and not runtime.flow.overloaded()
    )
    async with connect(url) as ws:
        started = await start(ws, mode="asr")
        assert started["type"] == "session.started" and started["credit_window"] == 8
    body = (await asyncio.to_thread(_metrics, slow_asr_server)).splitlines()
    assert any(line.startswith('voxserve_admission_shed_total{stage="asr"}') for line in body)
    assert 'voxserve_credit_window{stage="asr"} 8.0' in body


@pytest.fixture
def slow_batched_asr_server() -> Iterator[LiveServer]:
    # Finals through the ASR batcher (0.25 s a final, one batch at a time). The count and
    # the smoothed wait are out of reach (a queue limit of 100, a 60 s wait limit), so
    # pressure can only come from the prediction, or later from a late start.
    settings = configured(
        flow={"tick_ms": 50, "queue_limit": 100, "wait_limit_ms": 60000, "shed_after_s": 0.3},
    )
    with serving(one_asr_slot(settings), asr=FakeAsr(0.25)) as live:
        yield live


async def test_asr_pressure_is_predicted_lateness_before_any_final_starts_late(
    slow_batched_asr_server: LiveServer,
) -> None:
    """Six streams' finals behind a batch that runs seconds: the finals held behind it
    cannot start within their 0.5 s, which the flow monitor sees from the batch cost it
    fitted (or, before a batch is measured, from a final overdue while held), about a
    second before they start late; new sessions are refused and the admitted streams lose
    nothing. What it checks: the prediction is what the first pressure saw (with
    `predict_lateness` off there is none and this fails); the count and wait limits are out
    of reach. Not checked: that no final started late first (work outside the batcher,
    a decode at a pause, can delay one: seen once in six runs)."""
    live = slow_batched_asr_server
    runtime = live.runtime

    async def stream() -> list[dict[str, Any]]:
        async with connect(live.ws_url) as ws:
            await start(ws, mode="asr", partials=False)
            await send_audio(ws, utterances(2), speedup=4)
            await ws.send(json.dumps({"type": "audio.end"}))
            events, _ = await collect(ws, limit_s=90)
            return events

    streams = [asyncio.create_task(stream()) for _ in range(6)]
    window = runtime.flow.stage_windows
    await eventually(lambda: "asr" in window and window["asr"].size < 8, 30)
    stage = runtime.stages["asr"]
    assert stage.timeouts == 0
    assert runtime.flow.predicted_late["asr"] > 0  # what the first pressure saw
    body = (await asyncio.to_thread(_metrics, live)).splitlines()
    gauge = [line for line in body if line.startswith("voxserve_stage_predicted_late_seconds")]
    assert gauge and gauge[0].startswith('voxserve_stage_predicted_late_seconds{stage="asr"}')
    await eventually(lambda: runtime.flow.overloaded() == "asr", 10)
    event, code, _ = await refused(live.ws_url)
    assert event["code"] == "overloaded" and "asr" in event["message"] and code == 1013
    for events in await asyncio.gather(*streams):
        assert len(of_type(events, "transcript.final")) == 2  # admitted streams finish
        ended = events[-1]
        assert ended["type"] == "session.ended" and ended["processed"] == ended["received"]


@pytest.fixture
def busy_asr_server() -> Iterator[LiveServer]:
    # Finals through the batcher on one slot at 0.2 s each; every stream speaks a 0.5 s
    # tone every 1.2 s: about 1/6 of the engine each.
    # The queue rules are out of reach (limit 100, 60 s wait): only the streams' learned
    # cost can refuse.
    settings = configured(
        flow={
            "tick_ms": 50,
            "queue_limit": 100,
            "wait_limit_ms": 60000,
            "shed_after_s": 0.3,
            "asr_busy_limit": 0.9,
            "asr_busy_floor": 0.3,  # four streams keep it 0.4-0.67 busy: the rule judges
        },
    )
    with serving(one_asr_slot(settings), asr=FakeAsr(0.2)) as live:
        yield live


async def test_a_burst_of_arrivals_is_admitted_up_to_what_the_asr_engine_serves(
    busy_asr_server: LiveServer,
) -> None:
    """Four streams keep the engine half to 2/3 busy; then six arrive at once, before any of
    them has said a word. Their cost is known from the four (1/8 to 1/6 each), so only as
    many are admitted as keep the engine within 0.9 (one to four); the rest are
    refused at once with `overloaded` and a retry hint. What it checks: admission by the
    streams' learned cost, before the cost of the new ones shows in the queue (the queue
    and wait rules are out of reach here); the admitted streams lose nothing."""
    live = busy_asr_server
    runtime = live.runtime
    stop = asyncio.Event()

    async def speaker() -> list[dict[str, Any]]:
        async with connect(live.ws_url) as ws:
            started = await start(ws, mode="asr", partials=False)
            assert started["type"] == "session.started", started
            while not stop.is_set():
                await send_audio(ws, utterances(1))
            await ws.send(json.dumps({"type": "audio.end"}))
            events, _ = await collect(ws, limit_s=30)
            return events

    async def staggered(index: int) -> list[dict[str, Any]]:
        await asyncio.sleep(0.3 * index)  # finals 0.3 s apart: none waits for another
        return await speaker()

    speakers = [asyncio.create_task(staggered(i)) for i in range(4)]
    # The estimate is learned over a few seconds (the busy share is smoothed over ~2 s,
    # a stream's share over ~1 s of 50 ms ticks): until it is near 1/6.
    await eventually(lambda: 0.1 < (getattr(runtime.flow.demand, "per_stream", 0) or 0), 20)
    await eventually(lambda: runtime.flow.refuses_streams() is None, 10)
    assert runtime.flow.demand is not None
    share = runtime.flow.demand.per_stream
    assert share is not None and 0.1 < share < 0.4, share

    async def arrive() -> dict[str, Any]:
        """A refusal comes at connect, before any message of the client's (`refused`);
        an admitted connection hears nothing until it starts its session."""
        async with connect(live.ws_url) as ws:
            try:
                event: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 1.0))
                return event
            except TimeoutError:
                pass
            await ws.send(json.dumps({"type": "session.start", "mode": "asr"}))
            event = json.loads(await asyncio.wait_for(ws.recv(), 5))
            await asyncio.sleep(0.5)  # admitted: in, and silent so far
            return event

    began = time.monotonic()
    burst = await asyncio.gather(*(arrive() for _ in range(6)))
    admitted = [e for e in burst if e["type"] == "session.started"]
    refused = [e for e in burst if e["type"] == "error"]
    assert 1 <= len(admitted) <= 4 and len(admitted) + len(refused) == 6, burst
    for event in refused:
        assert event["code"] == "overloaded" and "limit of live streams" in event["message"]
        assert event["retry_after_ms"] == 2000
    assert time.monotonic() - began < 4.0
    body = (await asyncio.to_thread(_metrics, live)).splitlines()
    assert any(line.startswith("voxserve_asr_stream_share ") for line in body)
    stop.set()
    for events in await asyncio.gather(*speakers):
        assert of_type(events, "transcript.final")
        ended = events[-1]
        assert ended["type"] == "session.ended" and ended["processed"] == ended["received"]


def _metrics(live: LiveServer) -> str:
    import httpx

    return httpx.get(f"{live.http_url}/metrics", timeout=5).text


# -- a bursty client --------------------------------------------------------------------------


async def test_bursty_client_is_held_to_its_credit_window_and_nothing_is_lost() -> None:
    settings = configured(flow={"credit_window": 2})
    live = start_server(settings, fake_runtime(settings, vad=FakeVad(delay_s=0.03)))
    fullest = [0]
    stop = threading.Event()

    def watch_rings() -> None:  # what the server holds, sampled from its side
        while not stop.is_set():
            for ring in list(live.runtime.metrics.rings):
                fullest[0] = max(fullest[0], len(ring))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch_rings, daemon=True)
    watcher.start()
    try:
        async with connect(live.ws_url) as ws:
            await start(ws, mode="asr", partials=False)
            sent = await send_audio(ws, utterances(3), realtime=False)  # 3.6 s at once
            await ws.send(json.dumps({"type": "audio.end"}))
            events, _ = await collect(ws, limit_s=60)
    finally:
        stop.set()
        watcher.join()
        stop_server(live)
    batch = 2 * 512  # the listener's VAD batch: 2 windows of 512 samples
    # Held to 2 batches of audio waiting for VAD (plus the frame that crossed the line);
    # without the window the whole burst would sit in the 5 s ring.
    assert 0 < fullest[0] <= 2 * batch + FRAME_SAMPLES, fullest[0]
    ended = events[-1]
    assert ended["received"] == sent and ended["processed"] == sent
    assert ended["dropped"] == 0 and ended["rejected"] == 0
    assert len(of_type(events, "transcript.final")) == 3


# -- output pacing and output credit ----------------------------------------------------------


@pytest.fixture(scope="module")
def tts_server() -> Iterator[LiveServer]:
    settings = configured(
        tts={"pacing_lead_ms": 300, "max_chunk_ms": 200},
        limits={"stalled_client_s": 0.6},
        cache={"enabled": False},
    )
    with serving(settings, tts=FakeTts(seconds_per_word=0.2)) as live:
        yield live


async def _speak(ws: ClientConnection, words: int) -> None:
    text = " ".join(["word"] * words)
    await ws.send(json.dumps({"type": "text", "text": text, "flush": True}))


async def test_reply_audio_is_paced_to_playback(tts_server: LiveServer) -> None:
    async with connect(tts_server.ws_url) as ws:
        await start(ws, mode="tts")
        await _speak(ws, 15)  # 3 s of audio, made in a few milliseconds
        arrivals: list[tuple[float, float]] = []  # (time, audio seconds received by then)
        received = 0.0
        end: dict[str, Any] = {}
        async with asyncio.timeout(15):
            async for message in ws:
                if isinstance(message, bytes):
                    received += len(message) / 2 / 16_000
                    arrivals.append((time.monotonic(), received))
                elif json.loads(message)["type"] == "tts.end":
                    end = json.loads(message)
                    break
    first = arrivals[0][0]
    assert received == pytest.approx(3.0, abs=0.01)
    # Never more than the lead (0.3 s) ahead of playback, give or take a chunk (0.2 s).
    for at, total in arrivals:
        assert total <= (at - first) + 0.3 + 0.2 + 0.05, (at - first, total)
    assert arrivals[-1][0] - first >= 3.0 - 0.3 - 0.2 - 0.1
    assert end["underruns"] == 0 and not end["interrupted"]


async def test_output_credit_paces_and_a_client_without_credit_is_ended(
    tts_server: LiveServer,
) -> None:
    async def healthy() -> list[dict[str, Any]]:
        async with connect(tts_server.ws_url) as ws:
            await start(ws, mode="tts")
            await _speak(ws, 10)
            await ws.send(json.dumps({"type": "session.end"}))
            events, _ = await collect(ws, limit_s=15)
            return events

    alongside = asyncio.create_task(healthy())
    async with connect(tts_server.ws_url) as ws:
        await start(ws, mode="tts")
        await ws.send(json.dumps({"type": "credit", "audio_ms": 400}))
        await _speak(ws, 10)
        events, audio = await collect(ws, limit_s=10)
    got_ms = sum(len(a) for a in audio) / 2 / 16
    assert 400 <= got_ms <= 400 + 200  # the grant, overdrawn by at most one chunk
    errors = of_type(events, "error")
    assert errors and errors[0]["code"] == "client_stalled" and errors[0]["fatal"]
    assert events[-1]["type"] == "session.ended" and events[-1]["reason"] == "client_stalled"
    other = await alongside
    assert other[-1]["type"] == "session.ended" and other[-1]["reason"] == "completed"
    assert not of_type(other, "error")


async def test_bad_credit_message_is_refused(tts_server: LiveServer) -> None:
    async with connect(tts_server.ws_url) as ws:
        await start(ws, mode="tts")
        await ws.send(json.dumps({"type": "credit", "audio_ms": 0}))
        event = json.loads(await asyncio.wait_for(ws.recv(), 5))
    assert event["code"] == "invalid_message" and not event["fatal"]


# -- the session limit ------------------------------------------------------------------------


async def test_session_limit_refuses_at_once_with_a_retry_hint() -> None:
    with serving(configured(limits={"max_sessions": 2})) as live:
        async with connect(live.ws_url) as one, connect(live.ws_url) as two:
            for ws in (one, two):
                assert (await start(ws, mode="asr"))["type"] == "session.started"
            event, code, took = await refused(live.ws_url)
            assert event["code"] == "overloaded" and "limit of 2" in event["message"]
            assert event["retry_after_ms"] == 2000 and code == 1013 and took < 0.5
        await eventually(lambda: not live.runtime.active_sessions, 5)
        async with connect(live.ws_url) as ws:  # room again
            assert (await start(ws, mode="asr"))["type"] == "session.started"


def test_max_sessions_flag() -> None:
    from voxserve.cli.app import parse_command_line

    assert parse_command_line(["serve", "--max-sessions", "3"]).max_sessions == 3
    with pytest.raises(SystemExit):
        parse_command_line(["serve", "--max-sessions", "0"])


# -- resume -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def resume_server() -> Iterator[LiveServer]:
    with serving(configured(limits={"resume_window_s": 1.5}), asr=FakeAsr(0.05)) as live:
        yield live


async def test_dropped_client_resumes_without_losing_accepted_audio(
    resume_server: LiveServer,
) -> None:
    audio = np.concatenate([silence(0.3), tone(440, 1.0), silence(0.8), tone(880, 1.0)])
    tail = np.concatenate([tone(880, 0.3), silence(0.8)])
    ws = await connect(resume_server.ws_url)
    started = await start(ws, mode="asr", partials=False, resumable=True)
    assert started["resumable"] is True
    sent = await send_audio(ws, audio, speedup=4)
    await asyncio.sleep(0.3)
    ws.transport.abort()  # the network drops: no close handshake, no session.end
    await asyncio.sleep(0.2)
    assert resume_server.runtime.active_sessions == 1  # parked, not ended
    async with connect(resume_server.ws_url) as again:
        await again.send(
            json.dumps(
                {"type": "session.resume", "session_id": started["session_id"], "last_seq": 10}
            )
        )
        resumed = json.loads(await asyncio.wait_for(again.recv(), 5))
        assert resumed["type"] == "session.resumed"
        assert resumed["session_id"] == started["session_id"]
        assert resumed["acked_seq"] == sent - 1  # every frame sent was accepted
        resent = frame_message(sent - 1, tail[:320])  # a duplicate of an accepted frame
        await again.send(resent)
        await send_audio(again, tail, first_seq=sent, speedup=4)
        await again.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(again, limit_s=20)
    finals = [f["text"] for f in of_type(events, "transcript.final")]
    # The first final may have been sent before the drop and delivered then or now;
    # the second utterance spans the drop and is one final.
    assert finals[-1] == "tone880"
    ended = events[-1]
    assert ended["type"] == "session.ended" and ended["reason"] == "completed"
    assert ended["duplicates"] == 1 and ended["processed"] == ended["received"] - 1


async def test_resume_of_an_unknown_session_is_refused(resume_server: LiveServer) -> None:
    async with connect(resume_server.ws_url) as ws:
        await ws.send(json.dumps({"type": "session.resume", "session_id": "0" * 16}))
        event = json.loads(await asyncio.wait_for(ws.recv(), 5))
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)
    assert event["code"] == "resume_failed" and ws.close_code == 1008


async def test_parked_session_not_resumed_in_time_is_ended(resume_server: LiveServer) -> None:
    runtime = resume_server.runtime
    ws = await connect(resume_server.ws_url)
    started = await start(ws, mode="asr", resumable=True)
    await send_audio(ws, tone(440, 0.5), realtime=False)
    ws.transport.abort()
    await asyncio.sleep(0.3)
    assert runtime.active_sessions == 1
    await eventually(lambda: not runtime.active_sessions, 5)  # resume_window_s = 1.5
    async with connect(resume_server.ws_url) as again:
        await again.send(
            json.dumps({"type": "session.resume", "session_id": started["session_id"]})
        )
        event = json.loads(await asyncio.wait_for(again.recv(), 5))
    assert event["code"] == "resume_failed"


async def test_session_that_did_not_ask_to_be_resumable_ends_when_the_client_drops(
    resume_server: LiveServer,
) -> None:
    runtime = resume_server.runtime
    ws = await connect(resume_server.ws_url)
    await start(ws, mode="asr")
    await send_audio(ws, tone(440, 0.3), realtime=False)
    ws.transport.abort()
    await eventually(lambda: not runtime.active_sessions, 3)

"""The /v1/stream pipeline over a real socket, with fake engines (tests about the pipeline)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import websockets
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeAsr, FakeTts, FakeVad, SlowResponder, fake_runtime, silence, tone
from tests.helpers import settings_with
from tests.wsclient import as_read, collect, frame_message, of_type, run_asr, send_audio, start
from voxserve.config import load_settings
from voxserve.events import StreamConfig
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.session import Session


def two_utterances(f1: float, f2: float) -> np.ndarray:
    return np.concatenate([silence(0.3), tone(f1, 1.0), silence(0.8), tone(f2, 1.0), silence(0.8)])


async def test_audio_sent_at_once_gets_its_finals_and_no_partials(fake_server: LiveServer) -> None:
    """Audio far faster than real time (a recording sent at once) is past a partial's use
    (`asr.partial_max_speed`, 8x): every final, no partial decode in front of them. At 4x
    (the test below) partials come as before. What it checks: a server that takes in a
    recording faster than 8x real time decodes no partial of it."""
    _, _, events = await run_asr(fake_server.ws_url, two_utterances(440, 880), speedup=1000)
    assert [f["text"] for f in of_type(events, "transcript.final")] == ["tone440", "tone880"]
    assert of_type(events, "transcript.partial") == []


async def test_a_recording_sent_at_once_to_a_busy_server_gets_no_partials() -> None:
    """The same recording sent at once, to a server whose VAD judges only ~2x real time (a
    busy machine): the audio is no slower for it, so still no partial. What it checks: the
    pace is the sender's (audio received and not yet judged), not how fast this server
    happens to judge; on a shared CI machine the judging pace alone let a partial through."""
    settings = load_settings(port=free_port(), log_level="warning")
    slow_vad = FakeVad(delay_s=0.1)  # per VAD request, however much audio it judges
    live = start_server(settings, fake_runtime(settings, vad=slow_vad, asr=FakeAsr(delay_s=0.02)))
    audio = two_utterances(440, 880)
    try:
        _, _, events = await run_asr(live.ws_url, audio, speedup=1000)
    finally:
        stop_server(live)
    assert [f["text"] for f in of_type(events, "transcript.final")] == ["tone440", "tone880"]
    assert of_type(events, "transcript.partial") == []
    # Judging took longer than 1/8 of the audio's length: slower than partial_max_speed.
    assert slow_vad.calls * slow_vad.delay_s > len(audio) / 16000 / 8


async def test_asr_mode_turns_partials_and_finals(fake_server: LiveServer) -> None:
    started, frames, events = await run_asr(fake_server.ws_url, two_utterances(440, 880))
    assert started["mode"] == "asr" and started["trace_id"]
    finals = of_type(events, "transcript.final")
    assert [f["text"] for f in finals] == ["tone440", "tone880"]
    assert [f["segment"] for f in finals] == [0, 1]
    starts, ends = of_type(events, "vad.start"), of_type(events, "vad.end")
    assert len(starts) == 2 and len(ends) == 2
    # Speech began at 0.3 s and lasted 1 s: boundaries within a VAD window or two.
    assert abs(finals[0]["start_ms"] - 300) <= 70 and abs(finals[0]["end_ms"] - 1300) <= 70
    assert abs(finals[1]["start_ms"] - 2100) <= 70
    partials = of_type(events, "transcript.partial")
    assert partials and all(p["text"] == "tone440" for p in partials if p["segment"] == 0)
    # A partial of a segment never follows its final.
    for final in finals:
        idx = events.index(final)
        assert not [
            p
            for p in of_type(events[idx:], "transcript.partial")
            if p["segment"] == final["segment"]
        ]
    ended = events[-1]
    assert ended["type"] == "session.ended"
    assert ended["received"] == frames and ended["processed"] == frames
    assert ended["duplicates"] == 0 and ended["dropped"] == 0 and ended["segments"] == 2


async def test_duplicate_frames_are_processed_once(fake_server: LiveServer) -> None:
    audio = two_utterances(500, 700)
    async with connect(fake_server.ws_url) as ws:
        await start(ws, mode="asr")
        n = 0
        for seq, i in enumerate(range(0, audio.size, 320)):
            message = frame_message(seq, audio[i : i + 320])
            await ws.send(message)
            await ws.send(message)  # a retransmit
            n += 1
            if seq % 10 == 0:
                await asyncio.sleep(0.02)
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws)
    ended = events[-1]
    assert ended["received"] == 2 * n and ended["duplicates"] == n
    assert ended["processed"] == n
    assert [f["text"] for f in of_type(events, "transcript.final")] == ["tone500", "tone700"]


async def test_gaps_and_reordering_are_counted(fake_server: LiveServer) -> None:
    async with connect(fake_server.ws_url) as ws:
        await start(ws, mode="asr")
        for seq in (0, 1, 4, 2, 5):
            await ws.send(frame_message(seq, silence(0.02)))
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws)
    ended = events[-1]
    assert ended["gaps"] == 1 and ended["reordered"] == 1 and ended["processed"] == 5


async def test_twenty_concurrent_streams_keep_their_own_transcripts(
    fake_server: LiveServer,
) -> None:
    freqs = [300 + 40 * i for i in range(20)]

    async def one(freq: int) -> list[str]:
        _, _, events = await run_asr(fake_server.ws_url, two_utterances(freq, freq + 20))
        return [f["text"] for f in of_type(events, "transcript.final")]

    results = await asyncio.gather(*(one(f) for f in freqs))
    for freq, texts in zip(freqs, results, strict=True):
        assert texts == [f"tone{freq}", f"tone{freq + 20}"]


@pytest.mark.parametrize("rate", [8000, 22050, 24000, 48000])
async def test_input_is_resampled_from_client_rate(fake_server: LiveServer, rate: int) -> None:
    audio = np.concatenate([silence(0.3, rate), tone(600, 1.0, rate), silence(0.8, rate)])
    async with connect(fake_server.ws_url) as ws:
        await start(ws, mode="asr", sample_rate=rate)
        await send_audio(ws, audio, rate=rate, speedup=4.0)
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws)
    assert [f["text"] for f in of_type(events, "transcript.final")] == ["tone600"]
    assert abs(of_type(events, "transcript.final")[0]["start_ms"] - 300) <= 70


async def test_tts_mode_streams_text_in_pieces(fake_server: LiveServer) -> None:
    async with connect(fake_server.ws_url) as ws:
        started = await start(ws, mode="tts", output_sample_rate=16000)
        assert started["voice"] == "fake"
        await ws.send(json.dumps({"type": "text", "text": "one two three. four"}))
        await ws.send(json.dumps({"type": "text", "text": " five", "flush": True}))
        await ws.send(json.dumps({"type": "session.end"}))
        events, audio = await collect(ws)
    assert of_type(events, "tts.start")[0]["sample_rate"] == 16000
    end = of_type(events, "tts.end")
    assert len(end) == 1 and not end[0]["interrupted"]
    samples = sum(len(a) for a in audio) // 2
    assert samples == 5 * 1600  # five words x 0.1 s at 16 kHz: nothing lost
    assert end[0]["audio_ms"] == 500


async def test_tts_cancel_interrupts_and_session_goes_on(fake_server: LiveServer) -> None:
    runtime = fake_server.runtime
    tts = runtime.engines.tts[0]
    assert isinstance(tts, FakeTts)
    tts.chunk_delay_s = 0.05
    try:
        async with connect(fake_server.ws_url) as ws:
            await start(ws, mode="tts")
            words = " ".join(f"w{i}" for i in range(40))
            await ws.send(json.dumps({"type": "text", "text": words + ".", "flush": True}))
            events, _ = await collect(ws, until="tts.start")
            await ws.send(json.dumps({"type": "cancel"}))
            events, _ = await collect(ws, until="tts.end")
            assert events[-1]["interrupted"] is True and events[-1]["chunks"] < 40
            await ws.send(json.dumps({"type": "text", "text": "again", "flush": True}))
            await ws.send(json.dumps({"type": "session.end"}))
            events, _ = await collect(ws)
        assert of_type(events, "tts.end")[-1]["interrupted"] is False
    finally:
        tts.chunk_delay_s = 0.0


async def expect_error(url: str, first: object, code: str, close_code: int = 1008) -> dict:
    async with connect(url) as ws:
        await ws.send(first if isinstance(first, bytes) else json.dumps(first))
        event = json.loads(await ws.recv())
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
    assert event["type"] == "error" and event["code"] == code and event["fatal"] is True
    assert event["message"]
    assert closed.value.rcvd is not None and closed.value.rcvd.code == close_code
    return event


@pytest.mark.parametrize(
    ("first", "code"),
    [
        (b"\x00\x00\x00\x01" + b"\x00" * 640, "not_started"),
        ({"type": "text", "text": "hi"}, "not_started"),
        ({"type": "session.start", "mode": "karaoke"}, "unknown_mode"),
        ({"type": "session.start", "mode": "asr", "sample_rate": 44100}, "unsupported_sample_rate"),
        ({"type": "session.start", "mode": "asr", "encoding": "opus"}, "unsupported_encoding"),
        ({"type": "session.start", "mode": "tts", "voice": "nobody"}, "unknown_voice"),
        ({"type": "session.start", "mode": "asr", "language": "xx"}, "unknown_language"),
        ({"type": "session.start", "mode": "asr", "sample_rate": "16k"}, "invalid_message"),
        ({"type": "session.start", "mode": "asr", "chunk_ms": 5}, "invalid_parameter"),
    ],
)
async def test_session_start_errors(fake_server: LiveServer, first: object, code: str) -> None:
    await expect_error(fake_server.ws_url, first, code)


async def test_invalid_json_first_message(fake_server: LiveServer) -> None:
    async with connect(fake_server.ws_url) as ws:
        await ws.send("{not json")
        event = json.loads(await ws.recv())
    assert event["code"] == "invalid_json" and event["fatal"] is True


async def test_unknown_voice_error_lists_valid_voices(fake_server: LiveServer) -> None:
    event = await expect_error(
        fake_server.ws_url, {"type": "session.start", "mode": "tts", "voice": "x"}, "unknown_voice"
    )
    assert "fake" in event["message"]


async def test_bad_messages_mid_session_do_not_end_it(fake_server: LiveServer) -> None:
    async with connect(fake_server.ws_url) as ws:
        await start(ws, mode="asr")
        bad: list[tuple[object, str]] = [
            ("{oops", "invalid_json"),
            ("[1, 2]", "invalid_json"),
            (json.dumps({"type": "dance"}), "invalid_message"),
            (json.dumps({"type": "text", "text": "hello"}), "wrong_mode"),
            (json.dumps({"type": "session.start", "mode": "asr"}), "already_started"),
            (b"\x00\x01", "frame_too_short"),
            (b"\x00\x00\x00\x01", "empty_audio"),
            (b"\x00\x00\x00\x02" + b"\x00" * 641, "odd_length_pcm"),
            (b"\x00\x00\x00\x03" + b"\x00" * 64_000, "frame_too_large"),
        ]
        for message, code in bad:
            await ws.send(message)
            event = json.loads(await ws.recv())
            assert event["type"] == "error" and event["code"] == code, (message, event)
            assert event["fatal"] is False
        await send_audio(ws, two_utterances(440, 660), speedup=4.0, first_seq=10)
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws)
    assert [f["text"] for f in of_type(events, "transcript.final")] == ["tone440", "tone660"]
    assert events[-1]["rejected"] == 4


async def test_oversized_message_is_refused(fake_server: LiveServer) -> None:
    limit = fake_server.settings.limits.max_message_bytes
    async with connect(fake_server.ws_url, max_size=None) as ws:
        await start(ws, mode="tts")
        await ws.send(json.dumps({"type": "text", "text": "x" * (limit + 10)}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


async def test_text_over_limit_is_rejected(fake_server: LiveServer) -> None:
    limit = fake_server.settings.limits.max_text_chars
    async with connect(fake_server.ws_url) as ws:
        await start(ws, mode="tts")
        await ws.send(json.dumps({"type": "text", "text": "a" * (limit + 1)}))
        event = json.loads(await ws.recv())
        assert event["code"] == "text_too_long" and event["fatal"] is False
        await ws.send(json.dumps({"type": "session.end"}))
        events, _ = await collect(ws)
    assert events[-1]["type"] == "session.ended"


async def test_assistant_barge_in_cancels_the_reply() -> None:
    settings = load_settings(port=free_port(), log_level="warning")
    runtime = fake_runtime(
        settings,
        tts=FakeTts(chunk_delay_s=0.03, seconds_per_word=0.2),
        responder=SlowResponder(words=30, delay_s=0.02),
    )
    live = start_server(settings, runtime)
    try:
        async with connect(live.ws_url) as ws:
            await start(ws, mode="assistant")
            await send_audio(ws, np.concatenate([tone(440, 0.8), silence(0.7)]), speedup=2.0)
            events, _ = await collect(ws, until="tts.start")
            assert of_type(events, "transcript.final")[0]["text"] == "tone440"
            # The user talks over the reply.
            sender = asyncio.create_task(
                send_audio(ws, np.concatenate([tone(880, 0.8), silence(0.7)]), first_seq=100)
            )
            events, _ = await collect(ws, until="barge_in")
            interrupted = of_type(events, "tts.end")
            await sender
            await ws.send(json.dumps({"type": "audio.end"}))
            rest, _ = await collect(ws)
        events += rest
        ends = of_type(events, "tts.end")
        assert ends and ends[0]["interrupted"] is True
        assert ends[0]["audio_ms"] < 30 * 200  # far less than the whole reply
        assert interrupted == [] or interrupted[0]["interrupted"] is True
        finals = [f["text"] for f in of_type(events, "transcript.final")]
        assert finals == ["tone880"]
        assert rest[-1]["interrupted"] >= 1
    finally:
        stop_server(live)


async def test_client_leaving_withdraws_queued_model_work() -> None:
    settings = load_settings(port=free_port(), log_level="warning")
    asr = FakeAsr(delay_s=0.5)
    runtime = fake_runtime(settings, asr=asr, vad=FakeVad())
    live = start_server(settings, runtime)
    try:
        audio = np.concatenate([tone(440, 0.6), silence(0.6)] * 6)
        for _ in range(4):
            async with connect(live.ws_url) as ws:
                await start(ws, mode="asr", partials=False)
                await send_audio(ws, audio, realtime=False)
                await ws.send(json.dumps({"type": "audio.end"}))
                await asyncio.sleep(0.2)
            # leave without reading anything
        stage = runtime.stages["asr"]
        # A decode already on a thread runs out (0.5 s each; a speculative one at each pause
        # too): the stage empties soon, later on a loaded machine, not at a fixed time.
        async with asyncio.timeout(10):
            while stage.running or stage.waiting:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        # Each session had 6 utterances queued; leaving must have withdrawn most of them.
        assert len(asr.calls) < 4 * 6
        assert runtime.active_sessions == 0
    finally:
        stop_server(live)


async def test_metrics_show_sessions_frames_and_stage_latency(fake_server: LiveServer) -> None:
    import httpx

    await run_asr(fake_server.ws_url, two_utterances(440, 550), speedup=8.0)
    async with httpx.AsyncClient() as client:
        body = (await client.get(f"{fake_server.http_url}/metrics")).text
    assert 'voxserve_sessions_total{mode="asr",transport="ws"}' in body
    for stage in ("vad", "asr"):
        labels = f'{{stage="{stage}",work_class="live"}}'
        assert f"voxserve_stage_latency_seconds_count{labels}" in body
        assert f"voxserve_stage_queue_wait_seconds_count{labels}" in body
    processed = [
        line
        for line in body.splitlines()
        if line.startswith('voxserve_frames_total{outcome="processed"}')
    ]
    assert processed and float(processed[0].split()[-1]) > 0
    assert "voxserve_executor_workers" in body and "voxserve_ready 1.0" in body


async def test_marks_are_echoed_after_earlier_audio_is_handled(fake_server: LiveServer) -> None:
    async with connect(fake_server.ws_url) as ws:
        await start(ws, mode="asr")
        seq = await send_audio(ws, silence(0.1), realtime=False)
        await ws.send(json.dumps({"type": "mark", "id": 1}))
        event = json.loads(await asyncio.wait_for(ws.recv(), 2))
        # acked_seq: the last frame accepted before the mark (what a resuming client keeps)
        assert event == {"type": "mark", "id": 1, "acked_seq": seq - 1}
        seq = await send_audio(ws, silence(0.04), realtime=False, first_seq=seq)
        await ws.send(json.dumps({"type": "mark", "id": "two"}))
        await ws.send(json.dumps({"type": "mark", "id": True}))
        events = [json.loads(await asyncio.wait_for(ws.recv(), 2)) for _ in range(2)]
        codes = {e.get("code") for e in events}
        assert {"type": "mark", "id": "two", "acked_seq": seq - 1} in events
        assert "invalid_message" in codes
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws)
    assert events[-1]["processed"] == 7


async def test_tts_marks_follow_the_audio_before_them(fake_server: LiveServer) -> None:
    async with connect(fake_server.ws_url) as ws:
        await start(ws, mode="tts")
        await ws.send(json.dumps({"type": "text", "text": "one two.", "flush": True}))
        await ws.send(json.dumps({"type": "mark", "id": "after"}))
        await ws.send(json.dumps({"type": "session.end"}))
        events, _ = await collect(ws)
    kinds = [e["type"] for e in events]
    assert kinds.index("mark") > kinds.index("tts.end")


async def test_session_logs_carry_trace_ids_and_no_content(fake_server: LiveServer) -> None:
    import io
    import logging

    from voxserve.observe.logs import ContextFilter, JsonFormatter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("voxserve")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        async with connect(fake_server.ws_url) as ws:
            await start(ws, mode="tts", trace_id="trace-abc")
            await ws.send(json.dumps({"type": "text", "text": "secret words.", "flush": True}))
            await ws.send(json.dumps({"type": "session.end"}))
            await collect(ws)
        for _ in range(150):  # "session closed" is logged as the connection's tasks end
            if '"session closed"' in stream.getvalue() and "trace-abc" in stream.getvalue():
                break
            await asyncio.sleep(0.02)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    session_lines = [line for line in lines if line["msg"].startswith("session ")]
    # Other tests' sessions may end while this handler listens: every line has its ids.
    assert all(line["trace_id"] and line["session_id"] for line in session_lines)
    mine = [line for line in session_lines if line["trace_id"] == "trace-abc"]
    assert {line["msg"] for line in mine} >= {"session started", "session closed"}
    assert "secret" not in stream.getvalue()


async def test_idle_clients_and_endless_sessions_are_ended_with_their_codes() -> None:
    settings = settings_with(
        load_settings(port=free_port(), log_level="warning"),
        limits={"idle_timeout_s": 1.0, "max_session_s": 2.0},
    )
    live = start_server(settings, fake_runtime(settings))
    try:
        async with connect(live.ws_url) as ws:  # silent after the start
            await start(ws, mode="asr")
            events, _ = await collect(ws, limit_s=5)
        assert [e["type"] for e in events] == ["error", "session.ended"]
        assert events[0]["code"] == "idle_timeout" and events[0]["fatal"] is True
        async with connect(live.ws_url) as ws:  # busy, but for too long
            await start(ws, mode="asr")
            sender = asyncio.create_task(send_audio(ws, silence(4.0)))
            events, _ = await collect(ws, limit_s=5)
            sender.cancel()
        errors = of_type(events, "error")
        assert [e["code"] for e in errors] == ["session_expired"]
        assert events[-1]["type"] == "session.ended" and events[-1]["received"] > 0
    finally:
        stop_server(live)


def test_a_turn_that_is_answered_is_judged_window_by_window() -> None:
    """pipeline.vad_turn_windows (1): while a turn is in progress in a session that answers
    it, its end starts the reply, so the listener wakes per 32 ms window; silent, and in
    asr mode throughout, per vad_batch_windows (2). The credit window keeps its unit."""
    settings = load_settings(port=free_port(), log_level="warning")
    runtime = fake_runtime(settings)
    window = FakeVad.window_samples
    for mode, speaking_batch in (("assistant", window), ("asr", 2 * window)):
        session = Session(runtime.session_context(), StreamConfig(mode=mode), Outbox(8))
        listener = session.listener
        assert listener is not None and listener.batch_samples == 2 * window
        listener.turns.feed([0.9] * 20)  # 640 ms of speech: a turn in progress
        assert listener.turns.speaking and listener.batch_samples == speaking_batch, mode
        assert listener.credit_samples == 2 * window
        listener.turns.feed([0.0] * 60)  # its end
        assert not listener.turns.speaking and listener.batch_samples == 2 * window


async def test_larger_vad_batches_give_the_same_turns() -> None:
    """pipeline.vad_batch_windows = 4: the listener wakes per 128 ms of audio, and the
    turns, transcripts and counts are those of the default 64 ms batches."""
    settings = load_settings(port=free_port(), log_level="warning")
    settings = settings.model_copy(
        update={"pipeline": settings.pipeline.model_copy(update={"vad_batch_windows": 4})}
    )
    runtime = fake_runtime(settings, asr=FakeAsr(delay_s=0.02))
    listener = Session(runtime.session_context(), StreamConfig(mode="asr"), Outbox(8)).listener
    assert listener is not None and listener.batch_samples == 4 * FakeVad.window_samples
    live = start_server(settings, runtime)
    try:
        _, frames, events = await run_asr(live.ws_url, two_utterances(440, 880))
    finally:
        stop_server(live)
    finals = of_type(events, "transcript.final")
    assert [f["text"] for f in finals] == ["tone440", "tone880"]
    assert abs(finals[0]["start_ms"] - 300) <= 70 and abs(finals[0]["end_ms"] - 1300) <= 70
    ended = events[-1]
    assert ended["received"] == frames and ended["processed"] == frames


async def test_the_listener_task_wakes_for_turns_not_for_every_vad_batch() -> None:
    """VAD rounds judge a stream's audio and detect its turns without waking its task
    (pipeline/scheduling/vad_batch.py): 3.9 s of audio is ~60 VAD batches, and the task wakes only
    to send the two turns' events (and each turn's tentative end: its pause, its decode back,
    vad.speculate_ms) and to finish, with the same transcripts as ever."""
    settings = load_settings(log_level="warning")
    runtime = fake_runtime(settings, asr=FakeAsr(delay_s=0.0))
    outbox = Outbox(1024)
    session = Session(runtime.session_context(), StreamConfig(mode="asr", partials=False), outbox)
    listener = session.listener
    assert listener is not None
    running = asyncio.create_task(session.run())
    audio = two_utterances(440, 880)
    frames = [audio[i : i + 320] for i in range(0, audio.size, 320)]
    for seq, frame in enumerate(frames):
        await session.feed_audio(seq, memoryview(frame.tobytes()))
        await asyncio.sleep(0.001)  # a paced client: the rounds keep up with the frames
    await session.end_input()
    await asyncio.wait_for(running, 10)
    events = []
    while outbox.qsize():
        item = as_read(await outbox.next())
        if isinstance(item, dict):
            events.append(item)
    assert [f["text"] for f in of_type(events, "transcript.final")] == ["tone440", "tone880"]
    assert events[-1]["type"] == "session.ended" and events[-1]["processed"] == len(frames)
    judged = runtime.generation.vad_batcher().requests
    assert judged >= len(frames) // 4  # a request per 64 ms batch (or more, when partial)
    assert listener.task_wakeups <= 12 < judged

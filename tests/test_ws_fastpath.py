"""The WebSocket audio fast path (server/websocket/fastpath.py) on a real uvicorn server and real
sockets, with fake engines (the tests are about the receive path): frames are taken inside
the socket's parser, order with text messages holds, and everything the fast path leaves
(errors, other sample rates, credit waits) still goes the queued way with the same results."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.conftest import LiveServer
from tests.fakes import silence, tone
from tests.helpers import eventually, sessions_ended
from tests.wsclient import (
    collect,
    frame_message,
    frame_messages,
    of_type,
    run_asr,
    send_audio,
    start,
)
from voxserve.server.websocket.fastpath import (
    AudioFastPathProtocol,
    fast_path_of,
    websocket_protocol,
)
from voxserve.server.websocket.link import SessionLink


def counted(live: LiveServer) -> dict[str, float]:
    registry = live.runtime.metrics.registry
    return {
        path: registry.get_sample_value("voxserve_ws_audio_messages_total", {"path": path}) or 0.0
        for path in ("direct", "queued")
    }


async def counted_when_idle(live: LiveServer) -> dict[str, float]:
    """`counted` once no earlier connection is still ending (its counts would land here)."""
    await sessions_ended(live.runtime)
    return counted(live)


async def counted_after(live: LiveServer, before: dict[str, float], total: int) -> dict[str, float]:
    """Per-path counts of this test's connection (added when the connection ends)."""

    def all_counted() -> bool:
        now = counted(live)
        return sum(now.values()) - sum(before.values()) >= total

    await eventually(all_counted)
    now = counted(live)
    return {path: now[path] - before[path] for path in now}


def speech() -> np.ndarray:
    return np.concatenate([silence(0.3), tone(440, 1.0), silence(0.8)])


def test_uvicorn_runs_the_fast_path_protocol() -> None:
    assert websocket_protocol() is AudioFastPathProtocol
    assert fast_path_of({"type": "websocket", "extensions": {}}) is None  # another server


async def test_frames_are_taken_in_the_parser_with_the_same_results(
    fake_server: LiveServer,
) -> None:
    before = await counted_when_idle(fake_server)
    _, frames, events = await run_asr(fake_server.ws_url, speech())
    assert [f["text"] for f in of_type(events, "transcript.final")] == ["tone440"]
    ended = events[-1]
    assert ended["received"] == frames and ended["processed"] == frames
    paths = await counted_after(fake_server, before, frames)
    # Paced frames find the receiver waiting: (nearly) all go straight to the session.
    assert paths["direct"] >= 0.9 * frames, paths


async def test_frames_are_handed_over_a_vad_batch_at_a_time(
    fake_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Split frames are held in the protocol until the session's next VAD batch is due
    (64 ms, ~3 frames) and handed over together; nothing is lost or reordered, and what is
    held when the client stops is handed over before the end."""
    handed: list[int] = []
    real_sink = SessionLink._audio_sink

    def counting_sink(self: SessionLink) -> Callable[[list[bytes]], int]:
        sink = real_sink(self)

        def counted_sink(messages: list[bytes]) -> int:
            handed.append(len(messages))
            return sink(messages)

        return counted_sink

    monkeypatch.setattr(SessionLink, "_audio_sink", counting_sink)
    audio = speech()
    frames_sent = -(-audio.size // 320)
    _, frames, events = await run_asr(fake_server.ws_url, audio)
    assert frames == frames_sent
    assert [f["text"] for f in of_type(events, "transcript.final")] == ["tone440"]
    ended = events[-1]
    assert ended["received"] == frames and ended["processed"] == frames
    assert 0.9 * frames <= sum(handed) <= frames  # a frame may find the receiver busy
    assert max(handed) >= 3 and len(handed) <= frames / 2, handed


async def test_events_are_written_by_the_protocol_in_order(fake_server: LiveServer) -> None:
    """The session's events skip the ASGI send (voxserve_ws_events_direct_total) and
    arrive complete and in order."""
    registry = fake_server.runtime.metrics.registry

    def direct() -> float:
        return registry.get_sample_value("voxserve_ws_events_direct_total") or 0.0

    await sessions_ended(fake_server.runtime)  # an earlier connection's count lands late
    before = direct()
    _, frames, events = await run_asr(fake_server.ws_url, speech(), partials=False)
    kinds = [e["type"] for e in events if e["type"] != "credit"]  # credit: under load only
    assert kinds == ["vad.start", "vad.end", "transcript.final", "session.ended"], kinds
    assert events[-1]["processed"] == frames
    await eventually(lambda: direct() - before >= 3)  # all but the last, at least
    assert direct() - before <= len(events)


async def test_audio_after_end_is_refused_even_when_sent_at_once(fake_server: LiveServer) -> None:
    """A frame right behind audio.end cannot overtake it into the session: it goes the
    queued way behind it and is refused. Both leave in one TCP write, so that the frame
    reaches the server before the session (fake engines: a few ms) can end; sent apart,
    it may arrive after session.ended on a busy machine, and then it is no one's."""
    audio = speech()
    async with connect(fake_server.ws_url) as ws:
        await start(ws, mode="asr")
        frames = await send_audio(ws, audio, speedup=8.0)
        async with ws.send_context():
            ws.protocol.send_text(json.dumps({"type": "audio.end"}).encode())
            ws.protocol.send_binary(frame_message(frames, audio[:320]))
            ws.transport.write(b"".join(ws.protocol.data_to_send()))
        events, _ = await collect(ws)
    errors = of_type(events, "error")
    assert [e["code"] for e in errors] == ["invalid_message"], errors
    assert events[-1]["received"] == frames and events[-1]["processed"] == frames


async def test_bad_frames_take_the_queued_path_and_are_reported(fake_server: LiveServer) -> None:
    audio = speech()
    async with connect(fake_server.ws_url) as ws:
        await start(ws, mode="asr")
        frames = await send_audio(ws, audio[:16000], speedup=4.0)
        await ws.send(b"\x00\x00")  # shorter than the seq header
        await ws.send(frame_message(frames, audio[:320]) + b"\x01")  # odd PCM length
        frames = await send_audio(ws, audio[16000:], speedup=4.0, first_seq=frames + 1)
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws)
    codes = [e["code"] for e in of_type(events, "error")]
    assert codes == ["frame_too_short", "odd_length_pcm"], codes
    ended = events[-1]
    # Every good frame counted once; the bad ones counted as rejected, the session went on.
    assert ended["processed"] == frames - 1 and ended["rejected"] == 2, ended
    assert [f["text"] for f in of_type(events, "transcript.final")] == ["tone440"]


async def test_marks_follow_the_frames_sent_before_them(fake_server: LiveServer) -> None:
    audio = speech()
    async with connect(fake_server.ws_url) as ws:
        await start(ws, mode="asr")
        for seq in range(50):  # a burst: frames queue behind each other in the socket
            await ws.send(frame_message(seq, audio[seq * 320 : (seq + 1) * 320]))
        await ws.send(json.dumps({"type": "mark", "id": "m"}))
        mark = None
        async with asyncio.timeout(10):
            while mark is None:
                event = json.loads(await ws.recv())
                if event["type"] == "mark":
                    mark = event
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws)
    assert mark["id"] == "m" and mark["acked_seq"] == 49
    assert events[-1]["processed"] == 50


async def test_a_read_of_tens_of_thousands_of_frames_keeps_its_order(
    fake_server: LiveServer,
) -> None:
    """42,000 empty pings with the stream's frames and marks among them, in one write: the
    server handles such reads a turn at a time (fastpath.TURN_S; here ~0.3 s of work),
    reading paused in between, and nothing is lost or reordered: each mark acknowledges
    the frames before it, every frame is processed, the transcript and the end follow."""
    messages = frame_messages(speech())
    async with connect(fake_server.ws_url) as ws:
        await start(ws, mode="asr")
        async with ws.send_context():
            for seq, message in enumerate(messages):
                for _ in range(400):
                    ws.protocol.send_ping(b"")
                ws.protocol.send_binary(message)
                if seq % 10 == 9:
                    ws.protocol.send_text(json.dumps({"type": "mark", "id": str(seq)}).encode())
            ws.protocol.send_text(json.dumps({"type": "audio.end"}).encode())
            ws.transport.write(b"".join(ws.protocol.data_to_send()))
        events, _ = await collect(ws)
    marks = of_type(events, "mark")
    assert [(m["id"], m["acked_seq"]) for m in marks] == [
        (str(seq), seq) for seq in range(9, len(messages), 10)
    ]
    assert events[-1]["processed"] == len(messages), events[-1]
    assert [f["text"] for f in of_type(events, "transcript.final")] == ["tone440"]


async def test_other_sample_rates_take_the_queued_path(fake_server: LiveServer) -> None:
    before = await counted_when_idle(fake_server)
    _, frames, events = await run_asr(fake_server.ws_url, speech()[::2].copy(), sample_rate=8000)
    assert events[-1]["received"] == frames and events[-1]["processed"] == frames
    assert len(of_type(events, "transcript.final")) == 1
    paths = await counted_after(fake_server, before, frames)
    assert paths == {"direct": 0, "queued": frames}


async def test_a_failing_sink_costs_the_stream_nothing(
    fake_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the fast path must not close the connection (an exception in
    data_received would): the stream's audio takes the queue from then on."""

    def broken_sink(self: SessionLink) -> Callable[[list[bytes]], int]:
        def sink(messages: list[bytes]) -> int:
            raise RuntimeError("fast path bug")

        return sink

    monkeypatch.setattr(SessionLink, "_audio_sink", broken_sink)
    before = await counted_when_idle(fake_server)
    _, frames, events = await run_asr(fake_server.ws_url, speech())
    assert [f["text"] for f in of_type(events, "transcript.final")] == ["tone440"]
    assert events[-1]["received"] == frames and events[-1]["processed"] == frames
    paths = await counted_after(fake_server, before, frames)
    assert paths == {"direct": 0, "queued": frames}

"""Bulk work never takes the ASR slots live sessions need (issue 28, slot starvation).

A real server with the real Whisper at its default ASR concurrency (2): live WebSocket
sessions speak fixture utterances at real-time pace, first alone, then while two long
uploads (built from fixture speech) are transcribed and a short upload arrives behind them.
Every live final must arrive, within the bound that live finals meet alone; the uploads
must come back with the right text and time line, the short one without waiting for the
long ones. Before the fix the uploads held both slots for their whole length: finals
waited for them (or timed out) and the short upload waited for a 504.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.helpers import fixture_audio, fixture_texts, wer
from tests.wsclient import send_audio, start
from voxserve.audio.wav import write_wav
from voxserve.config import load_settings

RATE = 16_000
LIVE_SESSIONS = 3
UPLOAD_S = 45.0  # each long upload: 4 windows, ~3.5 s of Whisper CPU on the project's VMs
# A live final's time from its vad.end to its transcript.final. Measured on a loaded 2-core
# VM: alone P99 0.4-0.9 s; with the uploads 1.5-2.7 s (they share the two cores); before
# the fix P50 6.7 s, max 10 s with these uploads (60 s ones: a stage_timeout).
LIVE_FINAL_BOUND_S = 4.0
SMALL_UPLOAD_BOUND_S = 8.0  # a 2 s upload behind the long ones: 1-3.6 s; before, 10.7 s
GAP = np.zeros(RATE, dtype=np.int16)  # 1 s between live utterances: the VAD ends each


@dataclass
class LiveRecord:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    utterances: int = 0  # sent whole
    finals: int = 0


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    """Defaults throughout (pipeline.asr.concurrency 2, bulk_slots 1)."""
    live = start_server(load_settings(port=free_port(), log_level="warning"))
    yield live
    stop_server(live)


def _speech(seconds: float, rotate: int) -> tuple[np.ndarray, str]:
    """Fixture utterances, 0.5 s apart, until `seconds`: the audio and its transcript."""
    texts = fixture_texts()
    names = list(texts)
    names = names[rotate:] + names[:rotate]
    parts: list[np.ndarray] = []
    words: list[str] = []
    total = 0
    while total < seconds * RATE:
        for name in names:
            audio = fixture_audio(name)
            parts += [audio, GAP[: RATE // 2]]
            words.append(texts[name])
            total += audio.size + RATE // 2
    return np.concatenate(parts), " ".join(words)


async def _speak(url: str, record: LiveRecord, stop: asyncio.Event, seed: int) -> None:
    """One live session: utterances at real-time pace until `stop`, then every final."""
    names = list(fixture_texts())
    async with connect(url, max_size=None) as ws:
        started = await start(ws, mode="asr")
        assert started["type"] == "session.started", started
        reader = asyncio.create_task(_read(ws, record))
        seq, turn = 0, seed
        while not stop.is_set():
            utterance = fixture_audio(names[turn % len(names)])
            seq = await send_audio(ws, np.concatenate([utterance, GAP]), first_seq=seq)
            record.utterances += 1
            turn += 1
        await ws.send(json.dumps({"type": "audio.end"}))
        await asyncio.wait_for(reader, 30)


async def _read(ws: ClientConnection, record: LiveRecord) -> None:
    ended: dict[int, float] = {}
    async for message in ws:
        if isinstance(message, bytes):
            continue
        event = json.loads(message)
        kind = event["type"]
        if kind == "vad.end":
            ended[event["segment"]] = time.monotonic()
        elif kind == "transcript.final":
            record.finals += 1
            if event["segment"] in ended:
                record.latencies.append(time.monotonic() - ended.pop(event["segment"]))
        elif kind == "error":
            record.errors.append(event["code"])
        elif kind == "session.ended":
            return


async def _live_phase(
    live: LiveServer, work: asyncio.Future[object] | None, seconds: float
) -> LiveRecord:
    """LIVE_SESSIONS sessions speaking until `work` is done (or for `seconds`)."""
    record = LiveRecord()
    stop = asyncio.Event()
    speakers = [
        asyncio.create_task(_speak(live.ws_url, record, stop, seed))
        for seed in range(LIVE_SESSIONS)
    ]
    await asyncio.sleep(seconds)
    if work is not None:
        await asyncio.wait_for(asyncio.shield(work), 120)
    stop.set()
    await asyncio.gather(*speakers)
    return record


async def _upload(
    client: httpx.AsyncClient, audio: np.ndarray, fmt: str = "verbose_json"
) -> tuple[httpx.Response, float]:
    began = time.monotonic()
    reply = await client.post(
        "/v1/audio/transcriptions",
        files={"file": ("speech.wav", write_wav(audio, RATE), "audio/wav")},
        data={"model": "whisper-1", "response_format": fmt},
    )
    return reply, time.monotonic() - began


def _percentiles(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"P50 {statistics.median(ordered):.2f} s, P99 {p99:.2f} s, max {ordered[-1]:.2f} s"


@pytest.mark.slow
async def test_live_finals_keep_their_deadline_while_two_long_uploads_run(
    server: LiveServer,
) -> None:
    alone = await _live_phase(server, None, 5.0)
    long_uploads = [_speech(UPLOAD_S, rotate) for rotate in (0, 3)]
    small = fixture_audio("command.wav")
    async with httpx.AsyncClient(base_url=server.http_url, timeout=180) as client:

        async def uploads() -> list[tuple[httpx.Response, float]]:
            running = [asyncio.create_task(_upload(client, audio)) for audio, _ in long_uploads]
            await asyncio.sleep(1.0)  # both long uploads are in Whisper now
            short = await _upload(client, small, "json")
            return [short, *await asyncio.gather(*running)]

        work: asyncio.Future[list[tuple[httpx.Response, float]]] = asyncio.ensure_future(uploads())
        during = await _live_phase(server, work, 1.0)
        (short, short_s), *long_replies = work.result()

    print(f"\nlive finals alone: {_percentiles(alone.latencies)} ({alone.finals} finals)")
    print(f"live finals with 2 uploads: {_percentiles(during.latencies)} ({during.finals})")
    print(f"short upload: {short.status_code} in {short_s:.2f} s")
    print("long uploads: " + ", ".join(f"{r.status_code} in {s:.1f} s" for r, s in long_replies))
    for phase in (alone, during):
        assert phase.errors == [], phase.errors  # no stage_timeout, nothing lost
        assert phase.finals >= phase.utterances > 0
        assert max(phase.latencies) <= LIVE_FINAL_BOUND_S, _percentiles(phase.latencies)
    assert short.status_code == 200, short.text
    assert short_s <= SMALL_UPLOAD_BOUND_S
    assert wer(fixture_texts()["command.wav"], short.json()["text"]) <= 0.25
    for (reply, _), (audio, expected) in zip(long_replies, long_uploads, strict=True):
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert wer(expected, body["text"]) <= 0.1
        starts = [segment["start"] for segment in body["segments"]]
        assert starts == sorted(starts)  # windows joined on the recording's time line
        duration = audio.size / RATE
        assert duration - 10 < body["segments"][-1]["end"] <= duration + 0.01

"""A small real-time WebSocket client for tests: streams 20 ms frames by the wall clock."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect

from voxserve.events import ServerEvent
from voxserve.server.session.stream_protocol import encode_event

FRAME = 320


def as_read(item: ServerEvent | bytes | None) -> dict[str, Any] | bytes | None:
    """An outbox item as a WebSocket client reads it: an event as its JSON object (through
    the one encoder), audio and the end (None) as they are."""
    if item is None or isinstance(item, bytes):
        return item
    decoded: dict[str, Any] = json.loads(encode_event(item))
    return decoded


def frame_message(seq: int, pcm: np.ndarray) -> bytes:
    return seq.to_bytes(4, "big") + pcm.astype("<i2").tobytes()


def frame_messages(samples: np.ndarray) -> list[bytes]:
    """16 kHz `samples` as the binary messages of their 20 ms frames, seq 0 on, all at once:
    for tests that repeat, reorder, drop or time the frames themselves."""
    return [
        frame_message(seq, samples[i : i + FRAME])
        for seq, i in enumerate(range(0, samples.size, FRAME))
    ]


async def send_audio(
    ws: ClientConnection,
    samples: np.ndarray,
    *,
    rate: int = 16_000,
    realtime: bool = True,
    first_seq: int = 0,
    speedup: float = 1.0,
) -> int:
    """Send samples as 20 ms frames at real-time pace (or `speedup` x); returns next seq."""
    frame = rate // 50
    start = time.monotonic()
    seq = first_seq
    for i in range(0, samples.size, frame):
        await ws.send(frame_message(seq, samples[i : i + frame]))
        seq += 1
        if realtime:
            due = start + (seq - first_seq) * 0.02 / speedup
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
    return seq


async def start(ws: ClientConnection, **config: Any) -> dict[str, Any]:
    await ws.send(json.dumps({"type": "session.start", **config}))
    event = json.loads(await ws.recv())
    return dict(event)


async def collect(
    ws: ClientConnection, until: str = "session.ended", limit_s: float = 30.0
) -> tuple[list[dict[str, Any]], list[bytes]]:
    """Receive events (and audio) until an event of type `until` arrives."""
    events: list[dict[str, Any]] = []
    audio: list[bytes] = []
    async with asyncio.timeout(limit_s):
        async for message in ws:
            if isinstance(message, bytes):
                audio.append(message)
                continue
            event = json.loads(message)
            events.append(event)
            if event["type"] == until:
                break
    return events, audio


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


async def run_asr(
    url: str, audio: np.ndarray, *, speedup: float = 4.0, **config: object
) -> tuple[dict[str, Any], int, list[dict[str, Any]]]:
    """One asr session: start, `audio` at `speedup` x real time, audio.end, every event
    until session.ended. Returns (session.started, frames sent, events)."""
    async with connect(url) as ws:
        started = await start(ws, mode="asr", **config)
        assert started["type"] == "session.started", started
        rate = config.get("sample_rate", 16_000)
        assert isinstance(rate, int)
        frames = await send_audio(ws, audio, rate=rate, speedup=speedup)
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws)
        return started, frames, events

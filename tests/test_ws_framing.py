"""The fast path's own frame splitter (server/websocket/fastpath.py) against raw bytes on a real
socket: frames cut anywhere by TCP give the same session as whole ones, everything that is
not a whole binary message is still websockets' to parse (text, fragments, pings), and a
frame the splitter cannot judge (unmasked, over the size limit) fails that connection the
way websockets does, and no other."""

from __future__ import annotations

import asyncio
import json
import random
import socket
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosedError
from websockets.frames import Frame, Opcode

from tests.conftest import LiveServer
from tests.fakes import silence, tone
from tests.helpers import eventually, sessions_ended
from tests.wsclient import collect, frame_message, of_type, start


def wire(opcode: Opcode, payload: bytes, *, fin: bool = True, mask: bool = True) -> bytes:
    """One frame as a client puts it on the wire (masked unless told otherwise)."""
    return Frame(opcode, payload, fin=fin).serialize(mask=mask, extensions=[])


def audio_frames(samples: np.ndarray, first_seq: int = 0) -> list[bytes]:
    return [
        wire(Opcode.BINARY, frame_message(first_seq + k, samples[i : i + 320]))
        for k, i in enumerate(range(0, samples.size, 320))
    ]


def text(event: dict[str, Any]) -> bytes:
    return wire(Opcode.TEXT, json.dumps(event).encode())


def split_count(live: LiveServer) -> float:
    registry = live.runtime.metrics.registry
    return registry.get_sample_value("voxserve_ws_frames_split_total") or 0.0


async def send_raw(ws: ClientConnection, data: bytes, *, chunks: list[int] | None = None) -> None:
    """Write `data` on the socket as it is, in `chunks` sized pieces (each its own TCP
    segment: Nagle off, a pause between writes)."""
    transport = ws.transport
    sock = transport.get_extra_info("socket")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pos = 0
    for size in chunks or [len(data)]:
        transport.write(data[pos : pos + size])
        pos += size
        await asyncio.sleep(0.001)
    assert pos >= len(data)


def speech() -> np.ndarray:
    return np.concatenate([silence(0.3), tone(440, 1.0), silence(0.8)])


async def test_frames_cut_anywhere_by_tcp_give_the_same_session(fake_server: LiveServer) -> None:
    await sessions_ended(fake_server.runtime)
    before = split_count(fake_server)
    frames = audio_frames(speech())
    middle = len(frames) // 2
    mark, end = text({"type": "mark", "id": "half"}), text({"type": "audio.end"})
    stream = b"".join([*frames[:middle], mark, *frames[middle:], end])
    rng = random.Random(7)
    chunks = []
    while sum(chunks) < len(stream):
        chunks.append(rng.choice([1, 2, 3, 5, 9, 14, 200, 641, 700, 1500]))
    async with connect(fake_server.ws_url, compression=None) as ws:
        assert (await start(ws, mode="asr"))["type"] == "session.started"
        await send_raw(ws, stream, chunks=chunks)
        events, _ = await collect(ws)
    assert [f["text"] for f in of_type(events, "transcript.final")] == ["tone440"]
    assert [m["id"] for m in of_type(events, "mark")] == ["half"]
    assert not of_type(events, "error")
    ended = events[-1]
    assert ended["received"] == ended["processed"] == len(frames)
    assert ended["duplicates"] == 0 and ended["gaps"] == 0
    await eventually(lambda: split_count(fake_server) - before >= len(frames))
    assert split_count(fake_server) - before == len(frames)  # every one split here


async def test_fragments_and_pings_are_still_parsed_by_websockets(
    fake_server: LiveServer,
) -> None:
    """A binary message in two fragments is one audio message; a ping is answered; frames
    after them are split here again."""
    await sessions_ended(fake_server.runtime)
    before = split_count(fake_server)
    samples = speech()
    frames = audio_frames(samples[320:], first_seq=1)
    first = frame_message(0, samples[:320])
    fragmented = wire(Opcode.BINARY, first[:100], fin=False) + wire(Opcode.CONT, first[100:])
    async with connect(fake_server.ws_url, compression=None) as ws:
        await start(ws, mode="asr")
        await send_raw(ws, b"".join(frames[:10]))
        await send_raw(ws, fragmented)
        await asyncio.wait_for(await ws.ping(b"are you there"), 5)
        await send_raw(ws, b"".join(frames[10:]) + text({"type": "audio.end"}))
        events, _ = await collect(ws)
    ended = events[-1]
    assert not of_type(events, "error")
    assert ended["received"] == ended["processed"] == len(frames) + 1
    assert [f["text"] for f in of_type(events, "transcript.final")] == ["tone440"]
    await eventually(lambda: split_count(fake_server) - before >= len(frames))
    assert split_count(fake_server) - before == len(frames)  # not the fragmented one


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        (wire(Opcode.BINARY, frame_message(9, silence(0.02)), mask=False), 1002),
        # A header announcing 20 MB (over uvicorn's 16 MiB ws_max_size): refused at once.
        (bytes([0x82, 0xFF]) + (20_000_000).to_bytes(8, "big") + b"mask", 1009),
    ],
    ids=["unmasked", "too-large"],
)
async def test_a_frame_it_cannot_judge_fails_that_connection_only(
    fake_server: LiveServer, bad: bytes, code: int
) -> None:
    async with connect(fake_server.ws_url, compression=None) as good:
        await start(good, mode="asr")
        frames = audio_frames(speech())
        await send_raw(good, b"".join(frames[:20]))
        async with connect(fake_server.ws_url, compression=None) as ws:
            await start(ws, mode="asr")
            await send_raw(ws, b"".join(audio_frames(silence(0.2))))
            await send_raw(ws, bad)
            with pytest.raises(ConnectionClosedError) as closed:
                async with asyncio.timeout(10):
                    async for _ in ws:
                        pass
            assert closed.value.rcvd is not None and closed.value.rcvd.code == code
        await send_raw(good, b"".join(frames[20:]) + text({"type": "audio.end"}))
        events, _ = await collect(good)
    ended = events[-1]
    assert ended["received"] == ended["processed"] == len(frames) and not of_type(events, "error")

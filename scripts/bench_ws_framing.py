"""In-process cost of the WebSocket fast path's receive side per 20 ms audio frame: uvicorn's
`data_received` on `AudioFastPathProtocol` (server/websocket/fastpath.py), the frames split and
unmasked there and handed to a sink that takes them all (no session: this measures the
framing and the hand-over, not the session's work). No sockets: a transport that drops
what is written.

    .venv/bin/python -m scripts.bench_ws_framing     (from the repository root)

Two shapes: one frame per `data_received` (paced real-time audio: a TCP segment per frame)
and 50 frames per call (a second of audio in one read, as after a stall or from a batching
client).
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState
from websockets.frames import Frame, Opcode

from voxserve.server.websocket.fastpath import FAST_PATH, AudioFastPathProtocol

FRAMES = 20_000  # per round: short rounds, the best taken (a shared machine's noise)
ROUNDS = 30
HOLD_SAMPLES = 1024  # what a session waits for: one VAD batch (64 ms)


class NullTransport(asyncio.Transport):
    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "websocket.accept"})
    while (await receive())["type"] != "websocket.disconnect":
        pass


async def open_protocol(cls: type[Any]) -> tuple[Any, list[int]]:
    config = Config(app, ws_per_message_deflate=False, ws_ping_interval=None, log_config=None)
    config.load()
    protocol = cls(config, ServerState(), {}, asyncio.get_running_loop())
    protocol.connection_made(NullTransport())
    key = base64.b64encode(os.urandom(16)).decode()
    protocol.data_received(
        (
            "GET /v1/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    await asyncio.sleep(0.01)  # the app accepts
    fast = protocol.scope["extensions"][FAST_PATH]
    assert protocol.handshake_complete
    taken = [0]

    def sink(messages: list[bytes]) -> int:
        taken[0] += len(messages)
        return len(messages)

    fast.sink, fast.open, fast.hold_samples = sink, True, HOLD_SAMPLES
    return protocol, taken


def frame(seq: int) -> bytes:
    payload = seq.to_bytes(4, "big") + os.urandom(640)  # 320 samples at 16 kHz
    return Frame(Opcode.BINARY, payload).serialize(mask=True, extensions=[])


async def run(per_call: int, cls: type[Any] = AudioFastPathProtocol) -> float:
    protocol, taken = await open_protocol(cls)
    frames = [frame(i) for i in range(1000)]
    calls = [b"".join(frames[i : i + per_call]) for i in range(0, len(frames), per_call)]
    protocol.data_received(calls[0])  # the first goes to websockets, then splitting starts
    taken[0] = 0
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for _ in range(FRAMES // len(frames)):
            for data in calls:
                protocol.data_received(data)
        best = min(best, time.perf_counter() - started)
    assert taken[0] >= ROUNDS * FRAMES - HOLD_SAMPLES // 320, taken
    protocol.connection_lost(None)
    await asyncio.sleep(0.01)  # the app sees the disconnect and returns
    return FRAMES / best


async def main() -> None:
    for per_call in (1, 50):
        rate = await run(per_call)
        print(
            f"{per_call:>2} frame(s) per data_received: {rate:,.0f} frames/s ({1e6 / rate:.2f} us)"
        )


if __name__ == "__main__":
    asyncio.run(main())

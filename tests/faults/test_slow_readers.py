"""WebSocket clients that stop reading, on a real socket with a small receive buffer: the
server ends them with `client_stalled` (close 1008, counted, the session not kept for a
resume) at `limits.stalled_client_s` (a third more at most) after they stop, long before
the keepalive (uvicorn's ping at its default 20 s + 22 s) would close them with 1011; a
client that reads in bursts with pauses shorter than that is not ended; and when the
keepalive's missing pong comes first while output waits, it counts as stalled too.

The client is a raw socket: it answers pings only when it reads (as every real client does),
so not reading means not answering, whatever the kernels buffer."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from websockets.frames import Frame, Opcode

from tests.conftest import LiveServer, free_port
from tests.fakes import FakeTts, fake_runtime, silence, tone
from tests.helpers import eventually, settings_with
from tests.wsclient import frame_message
from voxserve.config import Settings, load_settings
from voxserve.server.serve import uvicorn_config

pytestmark = pytest.mark.timeout(60)
STALL_S = 1.5


class RawWs:
    """A WebSocket client on a plain socket: it reads only when told to, and answers the
    pings it reads then (as a browser or websockets would, once they read)."""

    def __init__(self, port: int, rcvbuf: int = 4096, path: str = "/v1/stream") -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self.sock.recv(4096)
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head

    def send(self, opcode: Opcode, payload: bytes) -> None:
        self.sock.sendall(Frame(opcode, payload).serialize(mask=True, extensions=[]))

    def send_json(self, message: dict[str, Any]) -> None:
        self.send(Opcode.TEXT, json.dumps(message).encode())

    def read(self, seconds: float) -> tuple[list[dict[str, Any]], int, tuple[int, str] | None]:
        """Read for up to `seconds` (answering pings): the events, the audio bytes, and the
        close (code, reason) if one came."""
        events: list[dict[str, Any]] = []
        audio = 0
        deadline = time.monotonic() + seconds
        self.sock.settimeout(0.05)
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                data = None
            if data == b"":
                return events, audio, None
            self.buffer += data or b""
            while (frame := self._frame()) is not None:
                opcode, payload = frame
                if opcode == Opcode.CLOSE:
                    code = int.from_bytes(payload[:2], "big")
                    return events, audio, (code, payload[2:].decode())
                if opcode == Opcode.PING:
                    self.send(Opcode.PONG, payload)
                elif opcode == Opcode.TEXT:
                    events.append(json.loads(payload))
                elif opcode == Opcode.BINARY:
                    audio += len(payload)
        return events, audio, None

    def _frame(self) -> tuple[Opcode, bytes] | None:
        buf = self.buffer
        if len(buf) < 2:
            return None
        length, pos = buf[1] & 0x7F, 2
        if length == 126:
            length, pos = int.from_bytes(buf[2:4], "big"), 4
        elif length == 127:
            length, pos = int.from_bytes(buf[2:10], "big"), 10
        if len(buf) < pos + length:
            return None
        self.buffer = buf[pos + length :]
        return Opcode(buf[0] & 0x0F), buf[pos : pos + length]

    def close(self) -> None:
        self.sock.close()


def _settings(stall_s: float) -> Settings:
    return settings_with(
        load_settings(port=free_port(), log_level="warning"),
        limits={"stalled_client_s": stall_s},
        cache={"enabled": False},
        grpc_port=0,
        wyoming_port=0,
    )


def _serve(
    settings: Settings, keepalive: tuple[float, float] | None = None
) -> Iterator[LiveServer]:
    """A real server on fake engines (FakeTts: 0.2 s of audio a word, made at once), with
    uvicorn's config as voxserve makes it, but for the keepalive (interval, timeout) if
    given."""
    runtime = fake_runtime(settings, tts=FakeTts(seconds_per_word=0.2))
    config = uvicorn_config(settings, runtime)
    if keepalive is not None:
        config.ws_ping_interval, config.ws_ping_timeout = keepalive
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    live = LiveServer(settings, runtime, server, thread)
    deadline = time.monotonic() + 30
    while not _ready(live):
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield live
    server.should_exit = True
    thread.join(timeout=10)


def _ready(live: LiveServer) -> bool:
    try:
        return httpx.get(f"{live.http_url}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def stall_server() -> Iterator[LiveServer]:
    yield from _serve(_settings(STALL_S))


def stalled_count(live: LiveServer) -> float:
    registry = live.runtime.metrics.registry
    sample = registry.get_sample_value(
        "voxserve_errors_total", {"code": "client_stalled", "transport": "ws"}
    )
    return sample or 0.0


def _open(live: LiveServer, mode: str) -> RawWs:
    ws = RawWs(live.settings.port)
    # Resumable: a client that stopped reading must be ended, not parked for a resume.
    ws.send_json({"type": "session.start", "mode": mode, "resumable": True})
    return ws


def _give_output(ws: RawWs, mode: str) -> None:
    """What makes the server write: a long reply (tts), or speech to transcribe (asr)."""
    if mode == "tts":
        ws.send_json({"type": "text", "text": "word " * 100, "flush": True})  # 20 s of audio
        return
    samples = np.concatenate([np.concatenate([tone(440, 0.3), silence(0.4)])] * 8)
    for seq, i in enumerate(range(0, samples.size, 320)):
        ws.send(Opcode.BINARY, frame_message(seq, samples[i : i + 320]))


@pytest.mark.parametrize("mode", ["tts", "asr"])
async def test_a_client_that_stops_reading_is_ended_as_stalled(
    stall_server: LiveServer, mode: str
) -> None:
    live = stall_server
    before = stalled_count(live)
    ws = _open(live, mode)
    try:
        began = time.monotonic()
        _give_output(ws, mode)
        await eventually(lambda: stalled_count(live) > before, timeout_s=STALL_S * 4 / 3 + 5)
        took = time.monotonic() - began
        # Not before the stall time; within a third more of it (the ping behind the output
        # follows it within stall/3), plus a loaded machine's slack. The keepalive would
        # have taken 42 s.
        assert STALL_S <= took <= STALL_S * 4 / 3 + 1.5, took
        assert stalled_count(live) == before + 1
        # Reading again, the client finds what it had not read, then the close frame.
        events, _, closed = ws.read(4.0)
        assert closed == (1008, "client_stalled"), (closed, [e["type"] for e in events])
        await eventually(lambda: live.runtime.active_sessions == 0, timeout_s=5)
    finally:
        ws.close()


def test_a_client_reading_in_bursts_is_not_ended(stall_server: LiveServer) -> None:
    """Pauses of 2/3 of the stall time between reads, answering pings when it reads: the
    whole reply (4 s of audio) arrives and the session ends normally."""
    live = stall_server
    before = stalled_count(live)
    ws = RawWs(live.settings.port)
    try:
        ws.send_json({"type": "session.start", "mode": "tts"})
        ws.send_json({"type": "text", "text": "word " * 20, "flush": True})
        ws.send_json({"type": "session.end"})
        events: list[dict[str, Any]] = []
        audio = 0
        closed = None
        deadline = time.monotonic() + 20
        while closed is None and time.monotonic() < deadline:
            got, size, closed = ws.read(0.1)
            events += got
            audio += size
            time.sleep(STALL_S * 2 / 3)
        assert closed == (1000, ""), closed
        assert events[-1]["type"] == "session.ended"
        assert events[-1]["reason"] == "completed"
        assert audio == 20 * 0.2 * 16_000 * 2
        assert stalled_count(live) == before
    finally:
        ws.close()


@pytest.fixture(scope="module")
def fast_keepalive_server() -> Iterator[LiveServer]:
    """Stall time 60 s, but uvicorn's keepalive at 0.3 s + 0.5 s: its missing pong is what
    comes first."""
    yield from _serve(_settings(60.0), keepalive=(0.3, 0.5))


@pytest.mark.parametrize(("output", "close"), [(True, 1008), (False, 1011)])
def test_the_keepalive_counts_as_stalled_only_while_output_waits(
    fast_keepalive_server: LiveServer, output: bool, close: int
) -> None:
    live = fast_keepalive_server
    before = stalled_count(live)
    ws = _open(live, "tts")
    try:
        if output:
            _give_output(ws, "tts")
        time.sleep(1.5)  # the keepalive's ping (0.3 s) unanswered for 0.5 s
        _, _, closed = ws.read(4.0)
        assert closed is not None and closed[0] == close, closed
        assert stalled_count(live) == before + (1 if output else 0)
    finally:
        ws.close()

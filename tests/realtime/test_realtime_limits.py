"""The session driver's limits on /v1/realtime, as on /v1/stream, on fake engines (a reply of
0.2 s a word, echoed): a client that stops reading while a reply plays is ended as the
WebSocket's are (tests/faults/test_slow_readers.py: `client_stalled`, counted for the
`realtime` transport, close 1008, at `limits.stalled_client_s` after it stops, not at the
keepalive's 42 s; a raw socket client with a small receive buffer, which answers pings only
when it reads); a silent one is ended `idle_timeout`, in-band, as the SDK reads it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosedOK
from websockets.frames import Opcode

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeTts, fake_runtime
from tests.faults.test_slow_readers import RawWs
from tests.helpers import eventually, realtime_connection, settings_with
from voxserve.config import load_settings

pytestmark = pytest.mark.timeout(60)
STALL_S = 1.5
IDLE_S = 5.0  # past the stall test's bound, so its client is ended as stalled


@pytest.fixture(scope="module")
def stall_server() -> Iterator[LiveServer]:
    settings = settings_with(
        load_settings(port=free_port(), log_level="warning"),
        limits={"stalled_client_s": STALL_S, "idle_timeout_s": IDLE_S},
        cache={"enabled": False},
    )
    live = start_server(settings, fake_runtime(settings, tts=FakeTts(seconds_per_word=0.2)))
    yield live
    stop_server(live)


def stalled(live: LiveServer) -> float:
    labels = {"code": "client_stalled", "transport": "realtime"}
    return live.runtime.metrics.registry.get_sample_value("voxserve_errors_total", labels) or 0.0


async def test_a_realtime_client_that_stops_reading_is_ended_as_stalled(
    stall_server: LiveServer,
) -> None:
    live = stall_server
    before = stalled(live)
    ws = RawWs(live.settings.port, path="/v1/realtime?model=gpt-realtime")
    try:
        events, _, _ = ws.read(1.0)
        assert [e["type"] for e in events] == ["session.created"], events
        content = [{"type": "input_text", "text": "word " * 100}]  # 20 s of reply audio
        item = {"type": "message", "role": "user", "content": content}
        ws.send(
            Opcode.TEXT, json.dumps({"type": "conversation.item.create", "item": item}).encode()
        )
        ws.send(Opcode.TEXT, json.dumps({"type": "response.create"}).encode())
        began = time.monotonic()
        await eventually(lambda: stalled(live) > before, timeout_s=STALL_S * 4 / 3 + 5)
        took = time.monotonic() - began
        assert STALL_S <= took <= STALL_S * 4 / 3 + 2.0, took
        # Reading again: what it had not read, then the close, never a goodbye it could
        # not have read.
        events, _, close = ws.read(5.0)
    finally:
        ws.close()
    assert close == (1008, "client_stalled"), (close, [e["type"] for e in events][-5:])
    assert any(e["type"] == "response.output_audio.delta" for e in events)
    assert stalled(live) == before + 1


async def test_a_silent_realtime_client_is_ended_idle_timeout(stall_server: LiveServer) -> None:
    seen: list[dict[str, Any]] = []
    began = time.monotonic()
    async with realtime_connection(stall_server, "unused", model="gpt-realtime") as conn:
        with pytest.raises(ConnectionClosedOK):  # 1000, after the goodbye
            while True:
                seen.append(json.loads(await conn.recv_bytes()))
    took = time.monotonic() - began
    assert IDLE_S <= took <= IDLE_S + 3, took
    assert [e["type"] for e in seen] == ["session.created", "error", "voxserve.session.ended"]
    assert (seen[1]["error"]["code"], seen[2]["reason"]) == ("idle_timeout", "idle_timeout")

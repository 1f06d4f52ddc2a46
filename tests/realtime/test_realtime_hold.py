"""/v1/realtime's appends on the WebSocket fast path (server/websocket/fastpath.py): held in the
protocol while the receiver waits and queued together, a VAD batch's worth at a time, as
/v1/stream's binary frames are; every other event is never held and goes after them. A real
server on fake engines, a real socket."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.conftest import LiveServer
from voxserve.server.realtime.stream import is_append
from voxserve.server.realtime_api.codec import RealtimeDecoder
from voxserve.server.session.input import Frames
from voxserve.server.websocket.fastpath import AudioFastPathProtocol

pytestmark = pytest.mark.timeout(60)
APPENDS = 40


def test_only_appends_are_held() -> None:
    assert is_append(b'{"type":"input_audio_buffer.append","audio":"AAAA"}')
    assert is_append(b'{ "type" : "input_audio_buffer.append", "audio": "AAAA"}')
    assert not is_append(b'{"audio":"AAAA","type":"input_audio_buffer.append"}')
    assert not is_append(b'{"type":"input_audio_buffer.commit"}')
    assert not is_append(b'{"type":"input_audio_buffer.appended"}')


async def test_appends_are_queued_together_and_none_is_lost_or_passed(
    fake_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups: list[int] = []
    decoded: list[int] = []
    hand_over = AudioFastPathProtocol._hand_over
    audio_of = RealtimeDecoder._audio

    def counting_hand_over(self: AudioFastPathProtocol) -> None:
        if self._texts:
            groups.append(len(self._texts))
        hand_over(self)

    def counting_audio(self: RealtimeDecoder, payload: bytes) -> Frames:
        decoded.append(len(payload))
        return audio_of(self, payload)

    monkeypatch.setattr(AudioFastPathProtocol, "_hand_over", counting_hand_over)
    monkeypatch.setattr(RealtimeDecoder, "_audio", counting_audio)
    pcm = (np.arange(480) % 100).astype("<i2").tobytes()  # 20 ms at 24 kHz
    append = json.dumps(
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}
    )
    url = f"ws://127.0.0.1:{fake_server.settings.port}/v1/realtime?model=gpt-realtime"
    async with connect(url) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        for _ in range(APPENDS):
            await ws.send(append)
            await asyncio.sleep(0.005)  # the receiver waits between them: they may be held
        await ws.send(json.dumps({"type": "input_audio_buffer.clear", "event_id": "evt_c"}))
        events: list[dict[str, Any]] = []
        while not events or events[-1]["type"] != "input_audio_buffer.cleared":
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
    # The clear was decoded after every append before it: none held back past it, none lost.
    assert decoded == [len(pcm)] * APPENDS
    assert not [e for e in events if e["type"] == "error"], events
    assert groups and max(groups) >= 2, groups
    assert sum(groups) <= APPENDS and len(groups) < APPENDS / 2, groups

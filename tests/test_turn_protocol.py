"""`turn_detection` on /v1/stream (session.start, session.update) over a real socket: the
one in force is echoed (session.started, session.updated), bad values are refused with
invalid_message / invalid_parameter naming the field (fatal at session.start only)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.asyncio.client import connect

from tests.conftest import LiveServer
from tests.wsclient import start


async def test_session_start_and_update_echo_the_turn_detection(fake_server: LiveServer) -> None:
    async with connect(fake_server.ws_url) as ws:
        started = await start(ws, mode="assistant", turn_detection={"type": "semantic_vad"})
        assert started["turn_detection"] == {"type": "semantic_vad", "eagerness": "auto"}
        update = {"type": "server_vad", "silence_duration_ms": 300}
        await ws.send(json.dumps({"type": "session.update", "turn_detection": update}))
        updated = json.loads(await ws.recv())
        assert updated == {"type": "session.updated", "turn_detection": update}
        bad = {"type": "semantic_vad", "eagerness": "eager"}
        await ws.send(json.dumps({"type": "session.update", "turn_detection": bad}))
        error = json.loads(await ws.recv())
        assert (error["code"], error["fatal"]) == ("invalid_parameter", False)
        assert "turn_detection.eagerness" in error["message"] and "low, medium" in error["message"]


async def test_a_tts_session_has_no_turn_detection(fake_server: LiveServer) -> None:
    async with connect(fake_server.ws_url) as ws:
        started = await start(ws, mode="tts")
        assert started["turn_detection"] is None
        update = {"type": "semantic_vad", "eagerness": "high"}
        await ws.send(json.dumps({"type": "session.update", "turn_detection": update}))
        assert json.loads(await ws.recv())["code"] == "wrong_mode"


@pytest.mark.parametrize(
    ("turn_detection", "code", "named"),
    [
        ({"type": "semantic_vad", "eagerness": "fast"}, "invalid_parameter", "eagerness"),
        ({"type": "server_vad", "silence_duration_ms": 5}, "invalid_parameter", "silence_dur"),
        ({"type": "server_vad", "eagerness": "high"}, "invalid_parameter", "eagerness"),
        ({"type": "semantic_vad", "silence_duration_ms": 300}, "invalid_parameter", "silence"),
        ({"type": "smart"}, "invalid_parameter", "turn_detection.type"),
        ({"eagerness": "low"}, "invalid_message", "turn_detection.type"),
        ("semantic_vad", "invalid_message", "turn_detection"),
    ],
)
async def test_a_bad_turn_detection_at_start_is_refused_naming_the_field(
    fake_server: LiveServer, turn_detection: Any, code: str, named: str
) -> None:
    async with connect(fake_server.ws_url) as ws:
        error = await start(ws, mode="asr", turn_detection=turn_detection)
        assert (error["type"], error["code"], error["fatal"]) == ("error", code, True)
        assert named in error["message"]

"""The baseline echo server (both event loops) speaks enough of /v1/stream for the bench's
load, and the overhead summary turns CPU into the issue's capacity ratio."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from websockets.asyncio.client import connect

from voxserve.bench.commands import overhead
from voxserve.bench.servers import spawn_echo


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_echo_server_answers_start_marks_and_end(loop: str, tmp_path: Path) -> None:
    with spawn_echo(tmp_path / "echo.log", loop=loop) as echo:
        async with connect(echo.url, compression=None) as ws:
            await ws.send(json.dumps({"type": "session.start", "mode": "asr"}))
            assert json.loads(await ws.recv())["type"] == "session.started"
            for seq in range(5):
                await ws.send(seq.to_bytes(4, "big") + bytes(640))
            await ws.send(json.dumps({"type": "mark", "id": 7}))
            assert json.loads(await ws.recv()) == {"type": "mark", "id": 7}
            await ws.send(json.dumps({"type": "audio.end"}))
            ended = json.loads(await ws.recv())
    assert ended["type"] == "session.ended" and ended["received"] == 5


def _step(cpu: float) -> Any:
    record = {"server": {"cpu_percent": cpu}, "latency_ms": {}, "valid": True}
    return SimpleNamespace(record=record)


def test_overhead_reports_capacity_against_the_echo_server() -> None:
    steps = {"voxserve": [_step(30.0), _step(34.0), _step(40.0)], "echo": [_step(15.0)] * 3}
    summary = overhead(steps)
    assert summary["server_cpu_percent"] == {"voxserve": 34.0, "echo": 15.0, "ratio": 2.27}
    assert summary["capacity_vs_echo"] == pytest.approx(15.0 / 34.0, abs=0.001)
    assert summary["valid"] is True

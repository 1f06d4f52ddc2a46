"""Clock jumps. The server reads `time.monotonic()` for the dedup window (session), the
idle and lifetime watch (server/session), stage deadlines (pipeline/scheduling/stage) and
quotas; a monotonic clock only jumps forward in practice (a VM resumed, a suspended host),
but a test clock can go both ways. A jump shorter than the session limits must change
nothing a client can see beyond the dedup bookkeeping; quotas are covered on a virtual clock
in tests/security/test_quotas_units.py."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.conftest import LiveServer
from tests.fakes import word_for
from tests.faults.harness import (
    alongside,
    back_to_baseline,
    counters_add_up,
    finals,
    resources,
    utterances,
)
from tests.wsclient import collect, frame_messages, of_type
from voxserve.audio.dedup import SeqDedup

pytestmark = pytest.mark.timeout(60)


async def accepted_up_to(ws: ClientConnection, seq: int) -> list[dict[str, Any]]:
    """Send a mark and read until its echo, which must acknowledge `seq`; the events read
    before it."""
    await ws.send(json.dumps({"type": "mark", "id": f"upto-{seq}"}))
    before: list[dict[str, Any]] = []
    while (event := json.loads(await ws.recv()))["type"] != "mark":
        before.append(event)
    assert (event["id"], event["acked_seq"]) == (f"upto-{seq}", seq), event
    return before


class JumpingTime:
    """Stands in for the `time` module of the patched modules: monotonic() plus `offset`."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_dedup_survives_jumps_both_ways() -> None:
    dedup = SeqDedup(0.5)
    accepted = sum(dedup.accept(seq, 100.0) for seq in range(10))
    assert accepted == 10
    assert not dedup.accept(5, 40.0)  # 60 s back: still a duplicate, nothing expires early
    assert dedup.accept(10, 40.0)
    assert dedup.accept(3, 10_000.0)  # far ahead: the window expired, a resend is new again
    assert (dedup.duplicates, dedup.reordered) == (1, 1)
    for seq in range(11, 1000):
        dedup.accept(seq, 10_000.0 + seq * 0.02)
    assert len(dedup._seen) <= 0.5 / 0.02 + 2  # memory stays one window once time moves on


async def test_live_clock_jumps_change_nothing_a_client_sees(
    fault_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = JumpingTime()
    for module in (
        "server.session.driver",
        "server.session.attachment",
        "pipeline.session",
        "pipeline.turns.audio_input",  # the dedup clock of frames that waited for credit
        "pipeline.scheduling.stage",
    ):
        monkeypatch.setattr(f"voxserve.{module}.time", clock)
    baseline = await resources(fault_server)
    messages = frame_messages(utterances(500, 900))  # 160 frames

    async def jumping() -> list[dict[str, Any]]:
        async with connect(fault_server.ws_url) as ws:
            await ws.send(json.dumps({"type": "session.start", "mode": "asr", "partials": False}))
            assert json.loads(await ws.recv())["type"] == "session.started"
            early: list[dict[str, Any]] = []
            for seq, message in enumerate(messages):
                if seq in (40, 100):
                    # The clock is the server's too: jump only once every earlier frame
                    # is accepted (a mark's echo says so), or a frame still held when the
                    # client jumps is stamped after the jump, and its resend with it.
                    early += await accepted_up_to(ws, seq - 1)
                    clock.offset += 120.0 if seq == 40 else -240.0  # forward, then back
                await ws.send(message)
                if seq in (41, 101):
                    await ws.send(messages[seq - 2])  # a resend straddling the jump
                if seq % 10 == 9:
                    await asyncio.sleep(0.04)
            await ws.send(json.dumps({"type": "audio.end"}))
            events, _ = await collect(ws)
        return early + events

    events = await alongside(fault_server, jumping())
    assert finals(events) == [word_for(500), word_for(900)]
    assert not of_type(events, "error")
    ended = of_type(events, "session.ended")[0]
    counters_add_up(ended, sent=162)
    # The resend after the forward jump is past the dedup window (processed again, counted
    # as reordered); the one after the backward jump is still within it (a duplicate).
    assert (ended["duplicates"], ended["reordered"]) == (1, 1)
    await back_to_baseline(fault_server, baseline)

"""Clock jumps. The server reads `time.monotonic()` for the dedup window (session), the
idle and lifetime watch (server/session), stage deadlines (pipeline/scheduling/stage) and
quotas; a monotonic clock only jumps forward in practice (a VM resumed, a suspended host),
but a test clock can go both ways. A jump shorter than the session limits must change
nothing a client can see beyond the dedup bookkeeping; quotas are covered on a virtual clock
in tests/security/test_quotas_units.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.fakes import word_for
from tests.faults.harness import (
    alongside,
    back_to_baseline,
    counters_add_up,
    finals,
    message_stream,
    resources,
    utterances,
)
from tests.wsclient import frame_messages, of_type
from voxserve.audio.dedup import SeqDedup

pytestmark = pytest.mark.timeout(60)


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
        "pipeline.scheduling.stage",
    ):
        monkeypatch.setattr(f"voxserve.{module}.time", clock)
    baseline = await resources(fault_server)
    messages = frame_messages(utterances(500, 900))  # 160 frames

    def jumping() -> Iterator[bytes]:
        for seq, message in enumerate(messages):
            if seq == 40:
                clock.offset += 120.0  # forward, under idle_timeout_s (300 s)
            if seq == 100:
                clock.offset -= 240.0  # and back, past where it started
            yield message
            if seq in (41, 101):
                yield messages[seq - 2]  # a resend straddling the jump

    events = await alongside(fault_server, message_stream(fault_server, jumping()))
    assert finals(events) == [word_for(500), word_for(900)]
    assert not of_type(events, "error")
    ended = of_type(events, "session.ended")[0]
    counters_add_up(ended, sent=162)
    # The resend after the forward jump is past the dedup window (processed again, counted
    # as reordered); the one after the backward jump is still within it (a duplicate).
    assert (ended["duplicates"], ended["reordered"]) == (1, 1)
    await back_to_baseline(fault_server, baseline)

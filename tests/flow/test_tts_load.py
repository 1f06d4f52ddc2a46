"""TTS admission by predicted lateness on real piper, cache off (issue 26): bursts that fit
are queued and served in budget over Wyoming (the `wyoming` package's client) and HTTP; a
sustained 4x overload spends the engine on admitted work only (goodput: `bench tts-steps`),
refuses the rest at once with Retry-After, and the admitted stay within budget.

The TTS stage is as configured by default (two slots, one reserved for live sessions while
live work waits: none here, so one-shot requests use both: pipeline/scheduling/stage.py). The
one-shot budget is this test's, derived from the capacity measured at start (a CI box differs from a
laptop), so the assertions are properties (none refused, within the budget, refusals
immediate), not exact times. A count-based rule (a fixed number waiting) refuses a burst of
16 whatever the budget, so these tests fail if admission regresses to counting.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import LiveServer, free_port, start_server, stop_server
from voxserve.bench.tts_burst import (
    http_burst,
    http_capacity,
    http_open_loop,
    summary,
    wyoming_burst,
)
from voxserve.config import load_settings

BUDGET_S = 3.0  # the least budget; the fixture raises it to fit this machine's capacity
MAX_BUDGET_S = 12.0  # and at most this (the fixture says why)
REFUSAL_S = 0.05  # refusals are answered before any synthesis
# The prediction is made once, at admission, server side: the client's own time and a
# machine slowing down afterwards come on top, up to about one request's engine time (the
# calls ahead run slower than measured): `slack`.
SLACK_S = 1.0
REQUEST_S: list[float] = []  # one request's engine time on one slot, measured at start


def slack() -> float:
    """SLACK_S, or one request's engine time on a machine slower than that (a quiet 2-core
    box takes ~0.7 s: SLACK_S; the shared one this was written on up to 3.3 s)."""
    return max(SLACK_S, *REQUEST_S)


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    base = load_settings(port=free_port(), log_level="warning")
    degrade = base.tts.degrade.model_copy(
        # The configured budget is what the slow-streak breaker judges misses by: the
        # most this test allows (admission reads the schedule's, set below per test).
        update={"enabled": True, "one_shot_first_audio_budget_ms": int(MAX_BUDGET_S * 1000)}
    )
    settings = base.model_copy(
        update={
            "cache": base.cache.model_copy(update={"enabled": False}),
            "tts": base.tts.model_copy(update={"degrade": degrade}),
            # The TTS queue must not shed sessions (flow.shed_tts is off).
            "flow": base.flow.model_copy(update={"shed_after_s": 1.0}),
        }
    )
    live = start_server(settings, wyoming_port=free_port())
    # The budget follows this machine's capacity (CI boxes differ): two closed-loop seconds
    # on the real engine (`rps` two-sentence requests a second over both slots), then 24
    # requests' service. A burst of 16 needs its 16 first clauses (about half a request
    # each: 8 / rps for the last) and the predictor may count the tails due before the
    # deadline too (16 / rps): 24 / rps is that and half again, as the first calls of a
    # burst run slower than a lone one.
    # At most MAX_BUDGET_S: a tail waits behind a burst's first clauses (EDF: first chunks
    # first), at most the budget, then its own clause, within the stage timeout (15 s a
    # chunk, its wait for a slot included); a machine too slow for 16 requests in that is
    # too slow for this test (a loaded one measured 0.6 requests a second: 12 s).
    rps, _ = asyncio.run(http_capacity(live.http_url, 2, 2.0))
    budget = min(max(BUDGET_S, 24 / rps), MAX_BUDGET_S)
    REQUEST_S[:] = [2 / rps]  # two slots
    live.runtime.tts_health.schedule.one_shot_budget_s = budget
    yield live
    stop_server(live)


@pytest.fixture
def fresh_share(server: LiveServer) -> LiveServer:
    """The server as a fresh one would admit a burst: the playback share admission learned
    from streams that ran dry is forgotten, the measured service rates kept. A stall of the
    machine in an earlier test makes a whole burst pause at once; admission cuts the share
    for it (to 0.57 in one such stall here) and recovers 0.01 a second, so the next test's
    burst of 16 was refused in part (`behind`: 3 here, 1 in CI), whatever this test's
    own burst does."""
    health = server.runtime.tts_health
    old = health.schedule
    assert not old.tickets, "a synthesis still in progress between tests"
    health.schedule = old.fresh()
    return server


def budget(server: LiveServer) -> float:
    return server.runtime.tts_health.schedule.one_shot_budget_s


@pytest.mark.parametrize("n", [8, 16])
async def test_a_wyoming_burst_that_fits_is_served_within_budget(
    fresh_share: LiveServer, n: int
) -> None:
    server = fresh_share
    results, wall = await wyoming_burst("127.0.0.1", server.settings.wyoming_port, n, 1)
    row = summary(results, wall)
    assert row["refused"] == 0, (row, server.runtime.tts_health.refusals)
    assert row["first_audio_p99_s"] <= budget(server) + slack(), row


@pytest.mark.parametrize("n", [8, 16])
async def test_an_http_burst_that_fits_is_served_within_budget(
    fresh_share: LiveServer, n: int
) -> None:
    server = fresh_share
    results = await http_burst(server.http_url, n)
    row = summary(results, max(r.total_s for r in results))
    assert row["refused"] == 0, (row, server.runtime.tts_health.refusals)
    assert row["first_audio_p99_s"] <= budget(server) + slack(), row


async def test_a_sustained_4x_overload_is_spent_on_admitted_work_and_the_rest_refused_at_once(
    server: LiveServer,
) -> None:
    """What admission guarantees at 4x capacity: the engine's work goes to admitted requests
    only (each runs to its end: no stage timeout, no engine error, audio for every one; a
    refused one gets no engine call: refused before any synthesis), the admitted keep their
    budget, the rest are refused at once with Retry-After. How much audio a second that
    makes beside capacity (goodput) is a throughput figure: `voxserve bench tts-steps`
    (scripts/bench_tts_burst.sh steps; docs/benchmarks.md, TTS bursts and overload)."""
    rps, _ = await http_capacity(server.http_url, 4, 3.0)
    # A budget of ~2 requests' service: admitted work (first clauses and their tails) stays
    # well inside the stage timeout; 4x for 4 s overflows it many times.
    schedule = server.runtime.tts_health.schedule
    stage = server.runtime.stages.stage("tts")
    timeouts, errors = stage.timeouts, stage.errors
    before, schedule.one_shot_budget_s = schedule.one_shot_budget_s, max(1.0, 2 / rps)
    try:
        results, wall = await http_open_loop(server.http_url, 4 * rps, 4.0, offset=3)
    finally:
        schedule.one_shot_budget_s, overload_budget = before, schedule.one_shot_budget_s
    row = summary(results, wall)
    refused = [r for r in results if not r.ok]
    served = [r for r in results if r.ok]
    assert refused and served, row  # 4x capacity: more than the budget's worth of work
    assert {r.code for r in refused} == {"tts_degraded"}, row
    assert all(r.retry_after and int(r.retry_after) >= 1 for r in refused), row
    quick = sorted(r.total_s for r in refused)
    assert quick[len(quick) // 2] < REFUSAL_S, (quick, row)  # refused before any synthesis
    assert row["first_audio_p99_s"] <= overload_budget + slack(), row
    # And each admitted stream plays through: admission counted its playback and the
    # others' (tts.degrade.continuity), so none starves a listener playing it as it comes.
    assert row["paused"] == 0, row
    # Goodput as work: nothing admitted was abandoned half-made (the waste that would cut
    # the audio rate under overload), whatever this machine's speed.
    assert (stage.timeouts, stage.errors) == (timeouts, errors), row
    assert all(r.audio_s > 0 for r in served), row
    # The rule and its inputs are metrics.
    async with httpx.AsyncClient() as client:
        metrics = (await client.get(f"{server.http_url}/metrics")).text
    counted = {
        reason: float(found.group(1))
        for reason in ("late", "behind")
        if (
            found := re.search(
                rf'^voxserve_tts_refusals_total\{{reason="{reason}"\}} (\S+)', metrics, re.M
            )
        )
    }
    assert sum(counted.values()) >= len(refused), counted
    assert re.search(r"^voxserve_tts_predicted_wait_seconds_count [1-9]", metrics, re.M)
    assert re.search(r'^voxserve_tts_service_ms_per_char\{voice="piper/joe"\} ', metrics, re.M)


async def test_a_refused_wyoming_request_gets_an_error_and_the_connection_stays_usable(
    server: LiveServer,
) -> None:
    """With syntheses in progress and a budget of 1 ms (set on the running server), a new
    Wyoming `synthesize` is predicted late: `error` (tts_degraded) at once; on the same
    connection, with the budget back, the next one is served."""
    from wyoming.audio import AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.error import Error
    from wyoming.tts import Synthesize

    schedule = server.runtime.tts_health.schedule
    busy = asyncio.create_task(http_burst(server.http_url, 4))
    while not schedule.active:  # noqa: ASYNC110 (a counter of the server thread)
        await asyncio.sleep(0.005)
    async with AsyncTcpClient("127.0.0.1", server.settings.wyoming_port) as client:
        before, schedule.one_shot_budget_s = schedule.one_shot_budget_s, 0.001
        try:
            await client.write_event(Synthesize(text="Are you there? Say something.").event())
            event = await client.read_event()
        finally:
            schedule.one_shot_budget_s = before
        assert event is not None and Error.is_type(event.type), event
        assert Error.from_event(event).code == "tts_degraded"
        await busy
        await client.write_event(Synthesize(text="Now there is room again.").event())
        while True:
            event = await client.read_event()
            assert event is not None and not Error.is_type(event.type), event
            if AudioStop.is_type(event.type):
                break

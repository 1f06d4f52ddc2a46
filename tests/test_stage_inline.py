"""Cheap calls of engines that allow it run on the event loop, not a worker thread
(pipeline/scheduling/stage.py): which calls go inline, how a dear engine goes back to the thread,
how failures are reported either way; then a real server on the load engines doing it."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import silence, tone
from tests.wsclient import collect, send_audio, start
from voxserve.config import load_settings
from voxserve.engines.base import inline_safe
from voxserve.engines.load import LoadAsr, LoadVad, burn
from voxserve.engines.silero_vad import SileroVad
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.scheduling.stage import MEASURED_BEFORE_INLINE, EngineStage

LOAD_CONFIG = Path(__file__).resolve().parents[1] / "bench" / "load-engines.toml"


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(2)
    yield pool
    pool.shutdown()


def _stage(executor: ThreadPoolExecutor, below_us: float = 500.0) -> EngineStage:
    return EngineStage("vad", 2, 2.0, executor, inline_below_s=below_us / 1e6)


def _where() -> int:
    return threading.get_ident()


async def _threads(stage: EngineStage, calls: int, *, inline_ok: bool = True) -> list[bool]:
    """For each of `calls` calls, whether it ran on the loop's thread."""
    loop_thread = threading.get_ident()
    ran = [await stage.run(_where, inline_ok=inline_ok) for _ in range(calls)]
    return [ident == loop_thread for ident in ran]


async def test_cheap_calls_go_inline_once_measured(executor: ThreadPoolExecutor) -> None:
    stage = _stage(executor)
    on_loop = await _threads(stage, MEASURED_BEFORE_INLINE + 5)
    assert on_loop == [False] * MEASURED_BEFORE_INLINE + [True] * 5
    assert stage.inline_calls == 5 and stage.calls == MEASURED_BEFORE_INLINE + 5
    assert 0 < stage.cost_s < 500e-6
    assert stage.running == 0 and stage._free == stage.concurrency


async def test_calls_not_allowed_inline_always_take_a_thread(
    executor: ThreadPoolExecutor,
) -> None:
    stage = _stage(executor)
    assert await _threads(stage, 8, inline_ok=False) == [False] * 8
    assert stage.inline_calls == 0


async def test_a_zero_threshold_keeps_every_call_on_a_thread(
    executor: ThreadPoolExecutor,
) -> None:
    stage = _stage(executor, below_us=0)
    assert await _threads(stage, 8) == [False] * 8


async def test_an_engine_that_grows_dear_goes_back_to_the_thread(
    executor: ThreadPoolExecutor,
) -> None:
    stage = _stage(executor)
    await _threads(stage, MEASURED_BEFORE_INLINE + 1)
    assert stage.inline_calls == 1
    loop_thread = threading.get_ident()

    def dear() -> int:
        burn(0.004)  # 4 ms of CPU, 8x the threshold
        return threading.get_ident()

    first = await stage.run(dear, inline_ok=True)
    assert first == loop_thread  # judged by the cost measured so far
    assert stage.cost_s > 500e-6
    later = [await stage.run(dear, inline_ok=True) for _ in range(3)]
    assert all(ident != loop_thread for ident in later)
    # Measured on the thread by its CPU time: cheap calls bring it back inline.
    on_loop = await _threads(stage, 30)
    assert not on_loop[0] and on_loop[-1]


async def _failing(stage: EngineStage, fn: Callable[[], object]) -> VoxError:
    with pytest.raises(VoxError) as caught:
        await stage.run(fn, inline_ok=True)
    assert stage.running == 0 and stage._free == stage.concurrency  # the slot came back
    return caught.value


def _bad_request() -> None:
    raise ValueError("unknown voice 'x'")


def _broken() -> None:
    raise RuntimeError("model exploded")


def _stop() -> None:
    raise StopIteration


@pytest.mark.parametrize("inline", [True, False])
async def test_failures_are_reported_the_same_inline_or_threaded(
    executor: ThreadPoolExecutor, inline: bool
) -> None:
    stage = _stage(executor, below_us=500.0 if inline else 0.0)
    await _threads(stage, MEASURED_BEFORE_INLINE)
    before = stage.inline_calls
    bad = await _failing(stage, _bad_request)
    assert bad.code is ErrorCode.INVALID_PARAMETER and "unknown voice" in bad.message
    broken = await _failing(stage, _broken)
    assert broken.code is ErrorCode.ENGINE_ERROR and "RuntimeError" in broken.message
    # A StopIteration cannot be set on an asyncio future: still this call's failure, no hang.
    stopped = await asyncio.wait_for(_failing(stage, _stop), 5.0)
    assert stopped.code is ErrorCode.ENGINE_ERROR
    assert stage.errors == 3
    assert stage.inline_calls - before == (3 if inline else 0)


def test_engines_say_whether_their_calls_may_run_inline() -> None:
    assert inline_safe(LoadVad()) and inline_safe(LoadAsr())
    assert not inline_safe(LoadVad(sleep_ms=5)) and not inline_safe(LoadAsr(sleep_ms=5))
    assert SileroVad.inline_safe is True
    assert not inline_safe(object())

    class Truthy:
        inline_safe = "yes"  # only True itself counts

    assert not inline_safe(Truthy())


@pytest.fixture(scope="module")
def load_server() -> Iterator[LiveServer]:
    settings = load_settings(LOAD_CONFIG, port=free_port(), log_level="warning")
    live = start_server(settings)
    yield live
    stop_server(live)


def _inline_calls(live: LiveServer) -> dict[str, float]:
    text = httpx.get(f"{live.http_url}/metrics", timeout=10).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("voxserve_stage_inline_calls_total{"):
            stage = line.split('stage="')[1].split('"')[0]
            found[stage] = float(line.rsplit(" ", 1)[1])
    return found


def test_a_server_on_the_load_engines_runs_their_calls_inline(load_server: LiveServer) -> None:
    async def utterances() -> list[dict[str, object]]:
        audio = np.concatenate([silence(0.3), tone(300, 1.5), silence(0.8)])
        async with connect(load_server.ws_url) as ws:
            await start(ws, mode="asr")
            seq = await send_audio(ws, audio, speedup=4.0)
            await send_audio(ws, audio, speedup=4.0, first_seq=seq)
            await ws.send(json.dumps({"type": "audio.end"}))
            events, _ = await collect(ws)
            return events

    before = _inline_calls(load_server)
    events = asyncio.run(utterances())
    finals = [e["text"] for e in events if e["type"] == "transcript.final"]
    assert finals == ["load test", "load test"]
    ended = events[-1]
    assert ended["type"] == "session.ended" and ended["received"] == ended["processed"]
    after = _inline_calls(load_server)
    assert after.get("vad", 0) > before.get("vad", 0)
    assert after.get("asr", 0) > before.get("asr", 0)

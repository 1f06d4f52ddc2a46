"""The fault server: fake engines that fail on cue (tests/faults/fakes.py), short stage
timeouts, a fixed-size executor (so threads are comparable before and after), the admin key
for /debug/stats, and every transport on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from pydantic import SecretStr
from wyoming.client import AsyncTcpClient
from wyoming.ping import Ping

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import fake_runtime
from tests.faults.fakes import FAULT_TIMEOUT_S, fault_engines
from tests.faults.harness import ADMIN_KEY, healthy_stream
from voxserve.config import ExecutorConfig, StageConfig, load_settings


@pytest.fixture(scope="package")
def fault_server() -> Iterator[LiveServer]:
    settings = load_settings(port=free_port(), log_level="error")
    pipeline = settings.pipeline.model_copy(
        update={
            "executor": ExecutorConfig(min_workers=6, max_workers=6, idle_release_s=3600),
            # 4 slots: a hung call keeps its slot until the engine returns (it cannot be
            # interrupted), and its batch's members are retried alone beside it.
            "asr": StageConfig(concurrency=4, timeout_s=FAULT_TIMEOUT_S),
            "tts": StageConfig(concurrency=2, timeout_s=FAULT_TIMEOUT_S),
        }
    )
    settings = settings.model_copy(update={"pipeline": pipeline, "admin_key": SecretStr(ADMIN_KEY)})
    runtime = fake_runtime(settings, **fault_engines())
    live = start_server(settings, runtime, grpc_port=free_port(), wyoming_port=free_port())
    asyncio.run(_warm_up(live))
    yield live
    stop_server(live)


async def _warm_up(live: LiveServer) -> None:
    """A first session and Wyoming request before any baseline is taken: lazily made
    server state (and the client libraries' own, in this same process) is not a leak."""
    await healthy_stream(live, 400)
    async with AsyncTcpClient("127.0.0.1", live.settings.wyoming_port) as wyoming:
        await wyoming.write_event(Ping().event())
        await wyoming.read_event()

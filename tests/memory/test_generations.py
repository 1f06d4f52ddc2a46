"""Engine generations without a server: a failed reload keeps the current engines, a
session's view of the runtime keeps its generation, and a retired generation closes once
its last lease is gone (also a lease whose session was collected without running)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from tests.fakes import FakeAsr, fake_runtime
from voxserve.config import EngineSpec, load_settings
from voxserve.engines.loaded import load_engines
from voxserve.errors import VoxError


class ClosingAsr(FakeAsr):
    closed = False

    def close(self) -> None:
        self.closed = True


async def test_failed_reload_keeps_serving_and_counts() -> None:
    settings = load_settings("bench/load-engines.toml")
    runtime = fake_runtime(settings)
    current = runtime.generation
    broken = settings.engines.model_copy(update={"asr": EngineSpec(name="no-such-engine")})
    runtime.settings = settings.model_copy(update={"engines": broken})
    with pytest.raises(VoxError, match="engine reload failed"):
        await runtime.reload(("asr",))
    assert runtime.generation is current and runtime.reloads == 0
    failed = runtime.metrics.engine_reloads.labels("failed")._value.get()
    assert failed == 1
    with pytest.raises(VoxError, match="kinds"):
        await runtime.reload(("gpu",))
    runtime.close()


async def test_views_keep_their_generation_and_the_old_one_closes_after_them() -> None:
    settings = load_settings("bench/load-engines.toml")
    old_asr = ClosingAsr()
    runtime = fake_runtime(settings, asr=old_asr)
    view = runtime.session_context()
    lease = view.lease
    unused = runtime.lease()  # a session that never ran: released when collected
    new = await runtime.reload(("asr",))
    assert new.number == 2 and runtime.engines.asr is not old_asr
    assert (
        view.engines.asr is old_asr and view.vad_batcher() is not runtime.generation.vad_batcher()
    )
    with pytest.raises(AttributeError):  # counters live on the runtime, not a context
        view.active_sessions += 1  # type: ignore[attr-defined]
    assert [g.number for g in runtime.generations] == [1, 2]
    lease.release()
    lease.release()  # idempotent
    assert not old_asr.closed  # the never-run session still holds generation 1
    del unused
    gc.collect()
    for _ in range(100):
        if old_asr.closed:
            break
        await asyncio.sleep(0.01)
    assert old_asr.closed and [g.number for g in runtime.generations] == [2]
    runtime.close()


def test_reload_of_some_kinds_carries_the_others_over() -> None:
    settings = load_settings("bench/load-engines.toml")
    first = load_engines(settings)
    second = load_engines(settings, kinds=("asr",), current=first)
    assert second.asr is not first.asr
    assert second.vad is first.vad and second.tts == first.tts
    assert second.responder is first.responder

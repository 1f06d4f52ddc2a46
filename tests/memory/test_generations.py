"""Engine generations without a server: a failed reload keeps the current engines, a
session's view of the runtime keeps its generation, and a retired generation closes once
its last lease is gone (also a lease whose session was collected without running)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from tests.fakes import FakeAsr, FakeVad, fake_runtime
from tests.helpers import eventually
from voxserve.config import EngineSpec, load_settings
from voxserve.engines.loaded import load_engines
from voxserve.engines.responders import EchoResponder
from voxserve.errors import VoxError
from voxserve.pipeline.generations import Lease
from voxserve.runtime import Runtime


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


class ClosingResponder(EchoResponder):
    """Counts its closes: `aclose` (an HTTP client, as the OpenAI responder's) and `close`."""

    def __init__(self) -> None:
        super().__init__()
        self.acloses = 0

    async def aclose(self) -> None:
        self.acloses += 1


class ClosesCounted:
    """An engine that counts its closes (each must happen once)."""

    closes = 0

    def close(self) -> None:
        self.closes += 1


class CountingAsr(ClosesCounted, FakeAsr):
    pass


class CountingVad(ClosesCounted, FakeVad):
    pass


async def test_a_reloaded_responder_is_closed_and_a_shared_engine_once() -> None:
    """The retired generation's responder had its async client left open (only those still
    listed at shutdown were closed); an engine two generations share was closed twice."""
    settings = load_settings("bench/load-engines.toml")
    old_responder, asr = ClosingResponder(), CountingAsr()
    runtime = fake_runtime(settings, responder=old_responder, asr=asr)
    held = runtime.lease()  # a session on generation 1 while the responder is reloaded
    await runtime.reload(("responder",))
    assert runtime.engines.responder is not old_responder and runtime.engines.asr is asr
    held.release()
    for _ in range(100):
        if old_responder.acloses:
            break
        await asyncio.sleep(0.01)
    assert old_responder.acloses == 1 and asr.closes == 0  # the ASR is still in use
    await runtime.reload(("tts",))
    second = runtime.lease()  # generation 3 shares the ASR with a generation 2 still held
    await runtime.reload(("vad",))
    await runtime.aclose()
    second.release()
    assert asr.closes == 1 and old_responder.acloses == 1


async def held_sharing(kind: str, engine: ClosesCounted) -> tuple[Runtime, Lease, Lease]:
    """Generations 1 and 2, each held by a session, share `engine` (a TTS reload between
    them); generation 3, current, has its own."""
    runtime = fake_runtime(load_settings("bench/load-engines.toml"), **{kind: engine})
    first = runtime.lease()
    await runtime.reload(("tts",))
    second = runtime.lease()
    await runtime.reload((kind,))
    assert getattr(runtime.engines, kind) is not engine
    return runtime, first, second


async def test_an_engine_a_live_retired_generation_uses_is_not_closed_under_it() -> None:
    """Generation 1 closing must leave the shared ASR to generation 2, still serving a
    session (it kept only what the current generation shared)."""
    asr = CountingAsr()
    runtime, first, second = await held_sharing("asr", asr)
    first.release()
    await eventually(lambda: [g.number for g in runtime.generations] == [2, 3])
    await asyncio.sleep(0.1)  # generation 1's closer has run
    assert asr.closes == 0
    second.release()
    await eventually(lambda: asr.closes)
    assert asr.closes == 1
    runtime.close()


async def test_two_retired_generations_closing_together_close_a_shared_engine_once() -> None:
    """Generations 1 and 2 lose their last sessions in the same moment: the first closer
    must count the second (removed from the live list, engines not yet closed) among those
    still using the shared VAD."""
    vad = CountingVad()
    runtime, first, second = await held_sharing("vad", vad)
    first.release()
    second.release()
    await eventually(lambda: vad.closes)
    await asyncio.sleep(0.1)
    assert vad.closes == 1
    runtime.close()

"""Hostile input, gRPC door (issue 35, finding 12): voxserve.v1 on a real server (fake
engines: this is about the wire) with the real grpc client, while a live stream is watched.

`Synthesize` echoed the client's `trace_id` into the trailing metadata of its refusal: a
control or non-ASCII character made grpc fail the call itself (INTERNAL "Invalid metadata",
a traceback in the log, the voxserve code lost), a long one took the metadata's room. Here
trace ids of every class go to every RPC that takes one (Synthesize, Converse, Recognize):
each is INVALID_ARGUMENT `invalid_message`, with a server-made trace id in the metadata, and
a valid one is still echoed. Client metadata of every class (long keys and values, `-bin`
keys, many keys, our own key names) is ignored or refused by grpc's metadata bound
(RESOURCE_EXHAUSTED), as are messages past `limits.max_message_bytes`; floods of bad
messages each get their in-stream error. A client whose session failed and that floods on
without half-closing is cut off within the fatal linger's bound. Nothing is logged as an
error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from pydantic import SecretStr

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeVad, fake_runtime
from tests.helpers import ErrorRecords
from tests.hostile.watch import watched
from tests.transports.grpc_client import collect, error_code, of_kind, stub
from voxserve.config import load_settings
from voxserve.server.grpc.codec import TRACE_ID, TRACE_ID_KEY
from voxserve.server.grpc.server import MAX_METADATA_BYTES
from voxserve.v1 import voxserve_pb2 as pb

pytestmark = pytest.mark.timeout(90)
KEY = "grpc-hostile-key"
BAD_TRACE_IDS: dict[str, str] = {
    "65 characters": "t" * 65,
    "10,000 characters": "t" * 10_000,
    "200,000 characters": "t" * 200_000,
    "accented": "café",
    "CJK": "追踪",
    "emoji": "🎙️",
    "right-to-left": "\u202etrace",
    "zero-width": "a\u200bb",
    "space": "a b",
    "header injection": "a\r\nx-evil: 1",
    "slash": "a/b",
    "quote": 'a"b',
    **{f"control {c:#04x}": f"a{chr(c)}b" for c in (*range(0, 32), 0x7F)},
}
GOOD_TRACE_IDS = ("t" * 64, "a", "A-z_0.9:x")


def _grpc_server(**overrides: Any) -> Iterator[LiveServer]:
    """A server on fake engines with gRPC on, `overrides` in its settings, stopped after."""
    settings = load_settings(port=free_port(), log_level="warning", **overrides)
    live = start_server(settings, fake_runtime(settings), grpc_port=free_port())
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    yield from _grpc_server()


@pytest.fixture(scope="module")
def keyed() -> Iterator[LiveServer]:
    """A server with an API key: the auth interceptor reads the metadata."""
    yield from _grpc_server(api_keys=[SecretStr(KEY)])


@pytest.fixture
def errors() -> Iterator[ErrorRecords]:
    handler = ErrorRecords()
    logging.getLogger().addHandler(handler)
    yield handler
    logging.getLogger().removeHandler(handler)
    assert not [r.getMessage()[:200] for r in handler.records]


def _calls(s: Any, trace_id: str) -> dict[str, Any]:
    """Each RPC that takes a trace id, started with `trace_id`."""
    return {
        "Synthesize": s.Synthesize(pb.SynthesizeRequest(text="hi", trace_id=trace_id)),
        "Converse": s.Converse(
            iter([pb.ConverseRequest(config=pb.StreamConfig(trace_id=trace_id))])
        ),
        "Recognize": s.Recognize(
            iter([pb.RecognizeRequest(config=pb.RecognitionConfig(trace_id=trace_id))])
        ),
    }


async def _refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await collect(call, limit_s=10)
    return caught.value


def _metadata(error: grpc.aio.AioRpcError) -> dict[str, str]:
    return {key: str(value) for key, value in error.trailing_metadata() or ()}


async def test_bad_trace_ids_are_invalid_argument_on_every_rpc(
    live: LiveServer, errors: ErrorRecords
) -> None:
    async with watched(live.http_url) as watch:
        async with grpc.aio.insecure_channel(live.grpc_target) as channel:
            s = stub(channel)
            for name, bad in BAD_TRACE_IDS.items():
                for method, call in _calls(s, bad).items():
                    error = await _refused(call)
                    where = (name, method, error.code(), error.details())
                    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, where
                    assert error_code(error) == "invalid_message", where
                    echoed = _metadata(error).get(TRACE_ID_KEY)
                    assert echoed is None or (TRACE_ID.fullmatch(echoed) and echoed != bad), where
            for good in GOOD_TRACE_IDS:
                for method, call in _calls(s, good).items():
                    responses = await collect(call, limit_s=10)
                    (started,) = of_kind(responses, "started")
                    assert started.trace_id == good, (method, started)
            # A flood: 200 refused at once, on one channel.
            calls = [
                s.Synthesize(pb.SynthesizeRequest(text="hi", trace_id="\n" * i))
                for i in range(1, 201)
            ]
            refused = await asyncio.gather(*(_refused(call) for call in calls))
            assert {error_code(e) for e in refused} == {"invalid_message"}
    watch.assert_unhurt(max_growth_mb=150)


async def test_hostile_metadata_is_ignored_or_refused_by_its_bound(
    keyed: LiveServer, errors: ErrorRecords
) -> None:
    auth = ("authorization", f"Bearer {KEY}")
    under = MAX_METADATA_BYTES // 2
    classes: dict[str, tuple[tuple[str, str | bytes], ...]] = {
        "binary -bin values": (auth, ("x-thing-bin", bytes(range(256)))),
        "our trace key, junk": (auth, (TRACE_ID_KEY, "a b c"), ("voxserve-trace-id-bin", b"\xff")),
        "our error key": (auth, ("voxserve-error-code", "ok")),
        "a long value": (auth, ("x-long", "v" * under)),
        "a long key": (auth, ("k" * 1_000, "v")),
        "many keys": (auth, *((f"x-k{i}", "v") for i in range(100))),
    }
    refused: dict[str, tuple[tuple[str, str | bytes], ...]] = {
        "a long authorization": (("authorization", "Bearer " + "k" * (MAX_METADATA_BYTES + 10)),),
        "past the bound": (auth, ("x-long", "v" * (MAX_METADATA_BYTES + 10))),
    }
    async with grpc.aio.insecure_channel(keyed.grpc_target) as channel:
        s = stub(channel)
        for name, metadata in classes.items():
            voices = await s.ListVoices(pb.ListVoicesRequest(), metadata=metadata, timeout=10)
            assert voices.voices, name
            spoken = s.Synthesize(pb.SynthesizeRequest(text="hi"), metadata=metadata)
            assert of_kind(await collect(spoken, limit_s=10), "ended"), name
        for name, metadata in refused.items():
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await s.ListVoices(pb.ListVoicesRequest(), metadata=metadata, timeout=10)
            assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, name
        for bad in ("Bearer", "Basic abc", "bearer " + "k" * 4_000):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await s.ListVoices(
                    pb.ListVoicesRequest(), metadata=(("authorization", bad),), timeout=10
                )
            assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED, bad[:20]
            assert error_code(caught.value) == "unauthorized"


async def test_oversized_and_flooded_messages(live: LiveServer, errors: ErrorRecords) -> None:
    limit = live.settings.limits.max_message_bytes
    async with watched(live.http_url) as watch:
        async with grpc.aio.insecure_channel(
            live.grpc_target, options=[("grpc.max_send_message_length", 4 * limit)]
        ) as channel:
            s = stub(channel)
            big = pb.SynthesizeRequest(text="x" * (limit + 1))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(s.Synthesize(big), limit_s=10)
            assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            # 1,000 odd-length frames, then a mark: each refused in the stream, the session on.
            requests = [pb.ConverseRequest(config=pb.StreamConfig(mode=pb.MODE_ASR))]
            requests += [
                pb.ConverseRequest(audio=pb.AudioFrames(seq_id=i, pcm=b"\x01" * 641))
                for i in range(1_000)
            ]
            requests.append(pb.ConverseRequest(mark=pb.Mark(id="after")))
            responses = await collect(s.Converse(iter(requests)), limit_s=30)
            flood = of_kind(responses, "error")
            assert len(flood) == 1_000 and {e.code for e in flood} == {"odd_length_pcm"}
            assert [m.id for m in of_kind(responses, "mark")] == ["after"]
            (ended,) = of_kind(responses, "ended")
            assert ended.rejected == 1_000, ended
    watch.assert_unhurt(max_growth_mb=150)


MARK = 0x1234  # a PCM sample value the failing VAD below breaks on


class FailsOnMarkedAudio(FakeVad):
    """Fails on a stream whose audio is all one marked sample: that session ends fatally
    (`engine_error`), the live stream beside it goes on."""

    def speech_probs(self, state: Any, audio: np.ndarray) -> np.ndarray:
        if audio.size and np.all(np.abs(audio - MARK / 32768) < 1e-6):
            raise RuntimeError("the marked stream's VAD broke")
        return super().speech_probs(state, audio)


@pytest.fixture(scope="module")
def short_lived() -> Iterator[LiveServer]:
    """A session whose audio is all MARK ends fatally on demand."""
    settings = load_settings(port=free_port(), log_level="warning")
    live = start_server(
        settings, fake_runtime(settings, vad=FailsOnMarkedAudio()), grpc_port=free_port()
    )
    yield live
    stop_server(live)


async def test_a_client_that_floods_on_after_a_fatal_end_is_cut_off_in_bounded_time(
    short_lived: LiveServer, errors: ErrorRecords
) -> None:
    """After a fatal `ended` the call reads on until the client half-closes or goes quiet
    (so a client still writing is not told INTERNAL), but at most FATAL_LINGER_S: a client
    that writes at 50x real time and never half-closes gets `ended`, then its status
    within that bound, the other streams unhurt and memory flat meanwhile."""
    from voxserve.server.grpc.stream import FATAL_LINGER_S

    async with watched(short_lived.http_url) as watch:
        async with grpc.aio.insecure_channel(short_lived.grpc_target) as channel:
            call = stub(channel).Converse(timeout=20)
            await call.write(pb.ConverseRequest(config=pb.StreamConfig(mode=pb.MODE_ASR)))
            over = asyncio.Event()

            write_failed: list[BaseException] = []

            async def flood() -> int:
                sent = 0
                pcm = np.full(320, MARK, dtype="<i2").tobytes()
                frame = pb.ConverseRequest(audio=pb.AudioFrames(seq_id=0, pcm=pcm))
                while not over.is_set():
                    try:
                        await call.write(frame)
                    except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                        write_failed.append(exc)
                        break  # the call is over
                    sent += 1
                    await asyncio.sleep(0.0004)  # ~50x real time (20 ms frames)
                return sent

            writer = asyncio.create_task(flood())
            kinds: list[str] = []
            ended_at = None
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for response in call:
                    kinds.append(response.WhichOneof("event"))
                    if kinds[-1] == "ended":
                        ended_at = asyncio.get_running_loop().time()
            status_at = asyncio.get_running_loop().time()
            over.set()
            sent = await writer
    assert kinds[0] == "started" and kinds[-1] == "ended" and ended_at is not None
    status = caught.value
    if status.code() is grpc.StatusCode.INTERNAL:
        # The server's status raced a write in flight: grpc's Python client then fails the
        # call itself with INTERNAL (aio/_call.py `set_internal_error`), whatever the server
        # sent. Only a client that never stops writing meets this; it is its own write
        # that failed, and the status says where.
        assert write_failed and "SendMessageOperation" in (status.debug_error_string() or "")
    else:
        assert status.code() is grpc.StatusCode.UNAVAILABLE, status
        assert error_code(status) == "engine_error"
    assert status_at - ended_at <= FATAL_LINGER_S + 1.0, status_at - ended_at
    assert sent > 1_000  # it really flooded
    watch.assert_unhurt(max_growth_mb=100)

"""Idle and lifetime limits on gRPC and Wyoming, with the WebSocket's codes: a silent client
is ended with `idle_timeout`, one that keeps talking past `limits.max_session_s` with
`session_expired`; sessions are counted out again. Fake engines, real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.ping import Ping, Pong

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import fake_runtime, silence
from tests.helpers import settings_with
from tests.transports.grpc_client import error_code, stub
from voxserve.config import load_settings
from voxserve.v1 import voxserve_pb2 as pb

IDLE_S = 0.4
LIFETIME_S = 1.2


@pytest.fixture(scope="module")
def limited_server() -> Iterator[LiveServer]:
    settings = settings_with(
        load_settings(port=free_port(), log_level="warning"),
        limits={"idle_timeout_s": IDLE_S, "max_session_s": LIFETIME_S},
    )
    live = start_server(
        settings, fake_runtime(settings), grpc_port=free_port(), wyoming_port=free_port()
    )
    yield live
    stop_server(live)


async def _responses(
    call: Any, ended: asyncio.Event | None = None
) -> tuple[list[str], grpc.aio.AioRpcError]:
    """The kinds of the call's responses, and the status it ended with; `ended` is set at
    the `ended` response (a client that stops writing then)."""
    kinds: list[str] = []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async with asyncio.timeout(10):
            async for response in call:
                kinds.append(response.WhichOneof("event"))
                if kinds[-1] == "ended" and ended is not None:
                    ended.set()
    return kinds, caught.value


async def test_grpc_silent_client_is_ended_with_idle_timeout(limited_server: LiveServer) -> None:
    async def silent() -> AsyncIterator[pb.RecognizeRequest]:
        yield pb.RecognizeRequest(config=pb.RecognitionConfig(sample_rate=16000))
        await asyncio.sleep(30)

    started = time.monotonic()
    async with grpc.aio.insecure_channel(limited_server.grpc_target) as channel:
        kinds, error = await _responses(stub(channel).Recognize(silent()))
    assert kinds == ["started", "ended"]
    assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert error_code(error) == "idle_timeout"
    assert IDLE_S - 0.05 <= time.monotonic() - started < IDLE_S + 2
    await _sessions_back_to_zero(limited_server)


async def test_grpc_session_past_its_lifetime_is_expired(limited_server: LiveServer) -> None:
    """A client that talks on past its session's lifetime, and half-closes once it is told
    `ended` (docs/protocol.md). One that never stops writing is the hostile gRPC flood
    test's: grpc's own client may then fail the call INTERNAL on its write in flight."""
    frame = silence(0.02).astype("<i2").tobytes()
    ended = asyncio.Event()

    async def talkative() -> AsyncIterator[pb.RecognizeRequest]:
        yield pb.RecognizeRequest(config=pb.RecognitionConfig(sample_rate=16000))
        for seq in range(1000):
            if ended.is_set():
                return
            yield pb.RecognizeRequest(audio=pb.AudioFrames(seq_id=seq, pcm=frame))
            await asyncio.sleep(0.05)  # well inside the idle limit

    async with grpc.aio.insecure_channel(limited_server.grpc_target) as channel:
        kinds, error = await _responses(stub(channel).Recognize(talkative()), ended)
    assert kinds[0] == "started" and kinds[-1] == "ended"
    assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert error_code(error) == "session_expired"
    await _sessions_back_to_zero(limited_server)


async def test_wyoming_silent_connection_is_closed_with_idle_timeout(
    limited_server: LiveServer,
) -> None:
    async with AsyncTcpClient("127.0.0.1", limited_server.settings.wyoming_port) as wyoming:
        await wyoming.write_event(Ping(text="hi").event())
        pong = await wyoming.read_event()
        assert pong is not None and Pong.is_type(pong.type)
        started = time.monotonic()
        reply = await wyoming.read_event()
        assert reply is not None and Error.from_event(reply).code == "idle_timeout"
        assert IDLE_S - 0.05 <= time.monotonic() - started < IDLE_S + 2
        assert await wyoming.read_event() is None  # then the server closes the connection


async def test_wyoming_connection_past_its_lifetime_is_closed(limited_server: LiveServer) -> None:
    codes: list[str | None] = []
    async with AsyncTcpClient("127.0.0.1", limited_server.settings.wyoming_port) as wyoming:
        async with asyncio.timeout(10):
            while True:  # a ping whenever 0.1 s passed without an event (well inside IDLE_S)
                try:
                    reply = await asyncio.wait_for(wyoming.read_event(), 0.1)
                except TimeoutError:
                    with contextlib.suppress(ConnectionError):  # closed meanwhile
                        await wyoming.write_event(Ping().event())
                    continue
                if reply is None:
                    break  # closed after the error
                if Error.is_type(reply.type):
                    codes.append(Error.from_event(reply).code)
    assert codes == ["session_expired"]


async def _sessions_back_to_zero(live: LiveServer) -> None:
    for _ in range(100):
        if live.runtime.active_sessions == 0:
            return
        await asyncio.sleep(0.02)
    assert live.runtime.active_sessions == 0

"""The session driver without a socket: a scripted way in (`FakeInput`), fake engines, and
what comes out of the outbox. The transports' own tests check the same rules end to end;
these pin the shared pieces: one quota charge for every way audio comes in, the fatal end
of each kind of wire, the counts, the input hook of the connection attached, parking."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.fakes import fake_runtime
from tests.wsclient import as_read
from voxserve.config import QuotaLimits, QuotasConfig, Settings, load_settings
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import MarkMessage, StreamConfig
from voxserve.runtime import Runtime
from voxserve.server.session.attachment import attach
from voxserve.server.session.auth import ANONYMOUS
from voxserve.server.session.driver import SessionDriver
from voxserve.server.session.events import limit_error
from voxserve.server.session.input import BadAudio, Decoded, InputEnd, Wire
from voxserve.server.session.parking import ParkedSessions
from voxserve.server.session.quotas import quotas_of

IN_BAND = Wire("ws", in_band_end=True, stalls=True, tasks="test")
STATUS = Wire("grpc", in_band_end=False, stalls=False, tasks="test-grpc")
FRAME = bytes(640)  # 20 ms of 16 kHz PCM16


class FakeInput:
    """A connection's way in, scripted: what the test puts is received in order; an
    exception put is raised by `decode`, anything else is handed on as decoded."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue[object] = asyncio.Queue()
        self.decoded: list[object] = []
        self.released = 0

    async def receive(self) -> object:
        return await self.messages.get()

    def decode(self, message: object) -> Decoded:
        self.decoded.append(message)
        if isinstance(message, Exception):
            raise message
        return message  # type: ignore[return-value]

    def release(self) -> None:
        self.released += 1


def settings(audio_s_per_min: float | None = None) -> Settings:
    quotas = QuotasConfig(anonymous=True, default=QuotaLimits(audio_s_per_min=audio_s_per_min))
    return load_settings(log_level="warning").model_copy(update={"quotas": quotas})


def open_driver(runtime: Runtime, wire: Wire = IN_BAND, owner: str | None = None) -> SessionDriver:
    config = StreamConfig(mode="asr", partials=False)
    return SessionDriver.open(runtime, lambda: config, wire=wire, principal=ANONYMOUS, owner=owner)


def queued(driver: SessionDriver) -> list[dict[str, Any] | bytes | None]:
    """What the outbox holds, as a client reads it (events as their JSON objects)."""
    outbox, items = driver.session.outbox, []
    while outbox.qsize():
        items.append(as_read(outbox._queue.get_nowait()))
    return items


def errors(runtime: Runtime, code: ErrorCode, transport: str) -> float:
    labels = {"code": code.value, "transport": transport}
    return runtime.metrics.registry.get_sample_value("voxserve_errors_total", labels) or 0.0


def frames(count: int, first_seq: int = 0) -> list[tuple[int, memoryview]]:
    return [(first_seq + i, memoryview(FRAME)) for i in range(count)]


async def test_audio_is_charged_once_whichever_way_it_comes() -> None:
    """A multi-frame message (gRPC), one frame (the WebSocket's queue) and frames taken
    without waiting (the fast path) draw on the same minute; over it, every refused frame
    counts in `rejected` and the run of refusals is reported once."""
    runtime = fake_runtime(settings(audio_s_per_min=1.0))
    driver = open_driver(runtime)
    try:
        assert await driver.charged(frames(30))  # 0.6 s in one message
        assert await driver.charged(frames(1, 30))  # 0.02 s
        driver.take_audio_now(frames(19, 31))  # 0.38 s: the whole second
        assert not queued(driver)
        driver.take_audio_now(frames(5, 50))  # 0.1 s: over the minute
        assert not await driver.charged(frames(30, 55))  # refused whole, same run
        session = driver.session
        assert session.rejected == 5 + 30
        assert session.received == 19  # taken by the session (the others were only charged)
        reports = [e for e in queued(driver) if isinstance(e, dict)]
        assert [(e["type"], e["code"], e["fatal"]) for e in reports] == [
            ("error", "quota_exceeded", False)
        ]
        assert errors(runtime, ErrorCode.QUOTA_EXCEEDED, "ws") == 1
    finally:
        driver.close()


async def test_an_in_band_fatal_end_is_the_error_then_ended_once() -> None:
    runtime = fake_runtime(settings())
    driver = open_driver(runtime)
    limits = runtime.settings.limits
    try:
        await driver.end_fatally(limit_error(limits, expired=False))
        await driver.end_fatally(limit_error(limits, expired=True))  # the first wins
        items = queued(driver)
        events = [i for i in items if isinstance(i, dict)]
        assert [e["type"] for e in events] == ["error", "session.ended"]
        assert events[0]["code"] == "idle_timeout" and events[0]["fatal"]
        assert events[1]["reason"] == "idle_timeout"
        assert items[2:] == [None]  # the output ends after them
        assert driver.closing and driver.fatal is None
        assert errors(runtime, ErrorCode.IDLE_TIMEOUT, "ws") == 1
        assert errors(runtime, ErrorCode.SESSION_EXPIRED, "ws") == 0
    finally:
        driver.close()


async def test_a_fatal_message_error_keeps_the_reason() -> None:
    """An error answering a client message ends the session but is not why it ended."""
    runtime = fake_runtime(settings())
    driver = open_driver(runtime)
    try:
        await driver.report(VoxError(ErrorCode.UNKNOWN_MODE, "no such mode", fatal=True))
        items = [i for i in queued(driver) if isinstance(i, dict)]
        assert [i["type"] for i in items] == ["error", "session.ended"]
        assert items[1]["reason"] == "completed"
        assert errors(runtime, ErrorCode.UNKNOWN_MODE, "ws") == 1
    finally:
        driver.close()


async def test_a_status_wire_ends_the_output_and_keeps_the_error() -> None:
    """gRPC: nothing in-band; `session.ended` and the status come after the output."""
    runtime = fake_runtime(settings())
    driver = open_driver(runtime, STATUS)
    limits = runtime.settings.limits
    try:
        error = limit_error(limits, expired=True)
        await driver.end_fatally(error)
        assert queued(driver) == [None]
        assert driver.fatal is error and driver.session.end_reason == "completed"
        assert errors(runtime, ErrorCode.SESSION_EXPIRED, "grpc") == 1
    finally:
        driver.close()


async def test_the_input_hook_reaches_only_the_connection_attached() -> None:
    """Session.release_input is the driver's, for the session's life: it reaches the
    connection attached now, never one that has left (c324e62)."""
    runtime = fake_runtime(settings())
    driver = open_driver(runtime)
    session = driver.session
    try:
        first, second = FakeInput(), FakeInput()
        async with attach(driver, first, since=time.monotonic()):
            assert session.release_input == driver.release_input
            session.release_input()
            assert first.released == 1
        assert first.released == 2  # what it held is handed over as it leaves
        session.release_input()
        assert first.released == 2
        async with attach(driver, second, since=time.monotonic()):
            session.release_input()
            assert (first.released, second.released) == (2, 1)
        assert session.release_input == driver.release_input
    finally:
        driver.close()


async def test_the_receiver_reports_bad_input_and_ignores_it_after_a_fatal_end() -> None:
    runtime = fake_runtime(settings())
    driver = open_driver(runtime)
    source = FakeInput()
    try:
        async with attach(driver, source, since=time.monotonic()) as attachment:
            source.messages.put_nowait(
                BadAudio(VoxError(ErrorCode.FRAME_TOO_SHORT, "shorter than its header"))
            )
            source.messages.put_nowait(VoxError(ErrorCode.INVALID_JSON, "not JSON"))
            await asyncio.sleep(0.05)
            assert driver.session.rejected == 1  # the bad audio; the bad control is not audio
            await driver.end_fatally(limit_error(runtime.settings.limits, expired=True))
            decoded = len(source.decoded)
            source.messages.put_nowait(MarkMessage("late"))  # after the end: not even read
            source.messages.put_nowait(InputEnd.GONE)
            assert attachment.receiver is not None
            await asyncio.wait_for(attachment.receiver, 1)
            assert len(source.decoded) == decoded
        codes = [i["code"] for i in queued(driver) if isinstance(i, dict) and i["type"] == "error"]
        assert codes == ["frame_too_short", "invalid_json", "session_expired"]
    finally:
        driver.close()


async def test_a_half_close_ends_the_input_and_the_idle_clock() -> None:
    runtime = fake_runtime(settings())
    driver = open_driver(runtime, STATUS)
    source = FakeInput()
    try:
        async with attach(driver, source, since=time.monotonic()) as attachment:
            source.messages.put_nowait(InputEnd.CLOSED)
            assert attachment.receiver is not None
            await asyncio.wait_for(attachment.receiver, 1)
            assert driver.session.input_closed and not attachment.input_open
    finally:
        driver.close()


async def test_counts_and_the_slot_follow_the_session() -> None:
    runtime = fake_runtime(settings())
    quotas = quotas_of(runtime)
    driver = open_driver(runtime)
    gauge = runtime.metrics.registry.get_sample_value
    assert quotas.sessions(ANONYMOUS) == 1  # taken at open
    driver.start()
    assert runtime.active_sessions == 1 and runtime.drain.live == 1
    assert gauge("voxserve_sessions_active", {"mode": "asr", "transport": "ws"}) == 1
    driver.close()
    driver.close()  # once
    await driver.wait_closed()
    assert runtime.active_sessions == 0 and runtime.drain.live == 0
    assert gauge("voxserve_sessions_active", {"mode": "asr", "transport": "ws"}) == 0
    assert quotas.sessions(ANONYMOUS) == 0
    assert driver.pipeline is not None and driver.pipeline.cancelled()


async def test_a_refused_open_gives_the_slot_back() -> None:
    runtime = fake_runtime(settings())

    def bad_config() -> Any:
        raise VoxError(ErrorCode.UNKNOWN_MODE, "no such mode", fatal=True)

    with pytest.raises(VoxError):
        SessionDriver.open(runtime, bad_config, wire=IN_BAND, principal=ANONYMOUS)
    assert quotas_of(runtime).sessions(ANONYMOUS) == 0


async def test_a_parked_session_is_taken_back_by_its_owner_or_expires() -> None:
    runtime = fake_runtime(settings())
    parked = ParkedSessions()
    driver = open_driver(runtime, owner="key-a")
    driver.start()
    parked.park(driver, 10.0)
    assert len(parked) == 1 and driver.session.outbox.stall_s is None
    with pytest.raises(VoxError) as refused:
        parked.take(driver.id, "key-b")
    assert refused.value.code is ErrorCode.RESUME_FAILED and len(parked) == 1
    assert parked.take(driver.id, "key-a") is driver and len(parked) == 0
    assert driver.session.outbox.stall_s == runtime.settings.limits.stalled_client_s
    parked.park(driver, 0.05)
    await asyncio.sleep(0.2)
    assert len(parked) == 0 and runtime.active_sessions == 0  # expired: closed
    await driver.wait_closed()

"""A connection attached to a session's driver, for as long as it is: its tasks.

The receiver reads the connection's `ClientInput` (session/input.py) into the session,
the limits watcher ends a session whose client went silent or that lasted too long, and a
push transport's sender (the WebSocket) drains the outbox into the socket; a pull
transport (gRPC) drains it in its response stream instead. Leaving the block cancels,
awaits and reports them; a resumed session gets a new attachment on its new connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Generic, TypeVar

from voxserve.config import LimitsConfig
from voxserve.errors import VoxError
from voxserve.server.session.driver import SessionDriver
from voxserve.server.session.events import limit_error
from voxserve.server.session.input import (
    BadAudio,
    ClientInput,
    InputEnd,
    apply_control,
    feed_frames,
)

log = logging.getLogger(__name__)

M = TypeVar("M")


class Attachment(Generic[M]):
    """`attach`: an async context manager around the connection's tasks."""

    def __init__(
        self,
        driver: SessionDriver,
        source: ClientInput[M],
        *,
        since: float,
        sender: Coroutine[Any, Any, None] | None,
    ) -> None:
        self.driver = driver
        self.source = source
        self.input_open = True  # the idle limit applies while the client may still send
        self._since = since
        self._sender_coro = sender
        self.sender: asyncio.Task[None] | None = None
        self.receiver: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Attachment[M]:
        driver = self.driver
        assert driver.attachment is None, "one connection at a time"
        driver.attachment = self
        driver.last_message_at = self._since
        limits = driver.runtime.settings.limits
        loop, prefix = asyncio.get_running_loop(), driver.wire.tasks
        if self._sender_coro is not None:
            self.sender = loop.create_task(self._sender_coro, name=f"{prefix}-sender")
            self._tasks.append(self.sender)
        self.receiver = loop.create_task(self._receive(), name=f"{prefix}-receiver")
        watcher = loop.create_task(self._watch(limits), name=f"{prefix}-limits")
        self._tasks += [self.receiver, watcher]
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for task in self._tasks:
            task.cancel()
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        self.source.release()  # held audio is counted in the session, either way
        self.driver.attachment = None
        for result in results:
            if isinstance(result, ConnectionError):  # the client left mid-write: not a fault
                log.info("client gone", extra={"transport": self.driver.wire.name})
            elif isinstance(result, BaseException) and not isinstance(
                result, asyncio.CancelledError
            ):
                log.error("session task failed", exc_info=result)
        log.info("session closed", extra={"transport": self.driver.wire.name})

    async def until_done(self) -> None:
        """Until the sender (the session is over) or the receiver (the client is gone)
        ends, or the pipeline ends because the client stalled (it reads nothing, so the
        sender never would). A pipeline that ends otherwise leaves the goodbye to the
        sender."""
        assert self.sender is not None and self.receiver is not None
        ends = {self.sender, self.receiver}
        pipeline = self.driver.pipeline
        if pipeline is not None and not pipeline.done():
            done, _ = await asyncio.wait(ends | {pipeline}, return_when=asyncio.FIRST_COMPLETED)
            if done & ends or self.driver.session.outbox.stalled:
                return
        await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)

    async def input_over(self, quiet_s: float) -> None:
        """Until the client's input ends (the receiver returns) or it has sent nothing for
        `quiet_s` (counted from its last message or from now, the later)."""
        receiver, driver = self.receiver, self.driver
        assert receiver is not None
        since = time.monotonic()
        while not receiver.done():
            quiet_left = max(driver.last_message_at, since) + quiet_s - time.monotonic()
            if quiet_left <= 0:
                return
            await asyncio.wait([receiver], timeout=quiet_left)

    def stop_sending(self) -> None:
        """The client stalled: the sender, stuck on the socket, stops."""
        if self.sender is not None:
            self.sender.cancel()

    async def _receive(self) -> None:
        """Read the client's messages until its input ends; an error in one message is
        reported and the session goes on, a fatal one ends it."""
        driver, source = self.driver, self.source
        session = driver.session
        while True:
            message = await source.receive()
            driver.last_message_at = time.monotonic()  # read by the limits watcher
            if isinstance(message, InputEnd):
                if message is InputEnd.CLOSED:
                    self.input_open = False
                    if not driver.closing:  # after a fatal error nothing is left to end
                        await session.end_input()
                return
            if driver.closing:
                continue  # a fatal error was sent; the session ends after it
            try:
                item = source.decode(message)
                if isinstance(item, list):
                    if await driver.charged(item):
                        await feed_frames(session, item)
                else:
                    await apply_control(session, item)
            except BadAudio as bad:
                session.rejected += 1
                await driver.report(bad.error)
            except VoxError as exc:
                await driver.report(exc)

    async def _watch(self, limits: LimitsConfig) -> None:
        """End a session whose client went silent (`idle_timeout_s`, while it may still
        send) or that has lasted `max_session_s`. A task of its own, so the receive path
        pays one clock read per message, not a timer."""
        driver = self.driver
        idle = limits.idle_timeout_s
        expires_at = driver.session.started_at + limits.max_session_s
        while not driver.closing:
            now = time.monotonic()
            if now >= expires_at:
                await driver.end_fatally(limit_error(limits, expired=True))
                return
            wake_at = expires_at
            if self.input_open:
                if now - driver.last_message_at >= idle:
                    await driver.end_fatally(limit_error(limits, expired=False))
                    return
                wake_at = min(wake_at, driver.last_message_at + idle)
            await asyncio.sleep(wake_at - now + 0.001)


def attach(
    driver: SessionDriver,
    source: ClientInput[M],
    *,
    since: float,
    sender: Coroutine[Any, Any, None] | None = None,
) -> Attachment[M]:
    """The connection's tasks while it is attached to `driver`: an async context manager.
    `since`: when the connection opened (the idle clock starts)."""
    return Attachment(driver, source, since=since, sender=sender)


async def serve_attached(
    driver: SessionDriver,
    source: ClientInput[M],
    sender: Coroutine[Any, Any, None],
    *,
    since: float,
) -> None:
    """`attach` with a sender task, until the session or the connection is over."""
    async with attach(driver, source, since=since, sender=sender) as attachment:
        await attachment.until_done()

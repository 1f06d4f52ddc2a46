"""One WebSocket connection's link to its session: the way in, the way out, the close.

The way in is the driver's `ClientInput`: the ASGI receive, and the fast path
(server/websocket/fastpath.py) bound to this session for this connection (`_bind`, `_unbind`):
its sink takes whole valid frames inside the socket's `data_received`, its hand-over is
the session's `release_input` (through the driver, which knows which connection is
attached), its stall detector ends the session (`SessionDriver.client_stalled`). The way
out is the sender: the outbox drained into the socket, events written by the protocol
when nothing has to wait, and the close code once the session is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from starlette.types import Message  # an ASGI websocket.receive message
from starlette.websockets import WebSocket, WebSocketDisconnect

from voxserve.config import LimitsConfig
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import event_type
from voxserve.observe.metrics import Metrics
from voxserve.server.session.attachment import serve_attached
from voxserve.server.session.driver import SessionDriver
from voxserve.server.session.events import internal_error, resumed_event
from voxserve.server.session.input import BadAudio, Decoded, InputEnd
from voxserve.server.session.stream_protocol import (
    encode_event,
    max_frame_bytes,
    parse_audio_frame,
    parse_text_message,
)
from voxserve.server.websocket.close_codes import CLOSE_INTERNAL, CLOSE_NORMAL, CLOSE_POLICY
from voxserve.server.websocket.fastpath import FastPath

log = logging.getLogger(__name__)


class SessionLink:
    def __init__(
        self,
        websocket: WebSocket,
        fast: FastPath | None,
        driver: SessionDriver,
        limits: LimitsConfig,
    ) -> None:
        self.ws = websocket
        self.fast = fast
        self._switch = fast or FastPath()  # no fast path: a switch nobody reads
        self.driver = driver
        self.session = driver.session
        self.limits = limits
        self._rate = driver.session.config.sample_rate
        self.client_left = False  # the socket closed under us (not a session.end)

    async def run(self, metrics: Metrics, *, resumed: bool, since: float) -> None:
        """Tell the client its session, then serve it until the session or the
        connection ends; `since`: when the connection opened."""
        driver, session = self.driver, self.session
        driver.announce(resumed=resumed)
        started = resumed_event(session) if resumed else session.started_event()
        try:
            await self.ws.send_text(encode_event(started))
        except (RuntimeError, OSError, WebSocketDisconnect):
            self.client_left = True  # gone before its session was told: no ASGI traceback
            return
        self._bind()
        try:
            await serve_attached(driver, self, self._send(), since=since)
        finally:
            self._unbind(metrics)
        if session.outbox.stalled:
            await close_stalled(driver, self.ws, self.fast)

    # -- the way in (session_input.ClientInput) -----------------------------------------

    async def receive(self) -> Message | InputEnd:
        switch = self._switch
        switch.open = True  # frames may go straight to the session while we wait
        try:
            message = await self.ws.receive()
        finally:
            switch.open = False
        if message["type"] == "websocket.disconnect":
            self.client_left = True
            return InputEnd.GONE
        return message

    def decode(self, message: Message) -> Decoded:
        data = message.get("bytes")
        limits = self.limits
        if data is not None:
            try:
                return [parse_audio_frame(data, self._rate, limits.max_frame_ms)]
            except VoxError as exc:
                raise BadAudio(exc) from None
        text = message.get("text") or ""
        return parse_text_message(text, limits.max_message_bytes, limits.max_json_depth)

    def release(self) -> None:
        """The fast path hands over what it holds, then holds back no more than the
        session now wants."""
        fast = self.fast
        if fast is not None:
            if fast.hand_over is not None:
                fast.hand_over()
            fast.hold_samples = self.session.audio_wanted_in()

    # -- the fast path, bound to this session for this connection ------------------------

    def _bind(self) -> None:
        fast = self.fast
        if fast is None:
            return
        fast.sink = self._audio_sink()
        # The protocol watches that the client reads (websocket/stall.py).
        fast.stall_s = self.limits.stalled_client_s
        fast.on_stall = self.driver.client_stalled

    def _unbind(self, metrics: Metrics) -> None:
        fast = self.fast
        if fast is None:
            return
        fast.on_stall = fast.stall_s = None
        fast.sink, fast.open = None, False
        counted = metrics.ws_audio_messages
        counted.labels("direct").inc(fast.direct)
        counted.labels("queued").inc(fast.queued)
        metrics.ws_frames_split.inc(fast.split)
        metrics.ws_events_direct.inc(fast.sent_direct)
        fast.direct = fast.queued = fast.split = fast.sent_direct = 0

    def _audio_sink(self) -> Callable[[list[bytes]], int]:
        """The fast path's sink (server/websocket/fastpath.py): valid frames the session can take
        without waiting are taken here, inside the socket's `data_received`, several at a
        time; it returns how many it took from the first, and the rest go to the receiver,
        which reports errors and waits for credit. It tells the protocol how much audio
        it may hold before the next hand-over: what the session can wait for."""
        driver, session, fast = self.driver, self.session, self.fast
        assert fast is not None
        max_frame_ms = self.limits.max_frame_ms
        rate = self._rate
        limit = max_frame_bytes(rate, max_frame_ms)

        def sink(messages: list[bytes]) -> int:
            if driver.closing:
                return 0
            frames: list[tuple[int, memoryview]] = []
            size = 0
            for data in messages:
                try:
                    seq, pcm = parse_audio_frame(data, rate, max_frame_ms, limit)
                except VoxError:
                    break  # it and what follows take the queue, which reports the error
                frames.append((seq, pcm))
                size += len(pcm)
            if not frames:
                taken = 0
            elif session.can_take_audio_now(last := frames[-1][1].nbytes, ahead=size - last):
                driver.take_audio_now(frames)
                taken = len(frames)
            else:  # not all at once: as many as fit, one at a time
                taken = 0
                for frame in frames:
                    if not session.can_take_audio_now(frame[1].nbytes):
                        break
                    driver.take_audio_now([frame])
                    taken += 1
            fast.hold_samples = session.audio_wanted_in()
            return taken

        return sink

    # -- the way out ----------------------------------------------------------------------

    async def _send(self) -> None:
        """Drain the outbox into the socket; ends the connection when the session is over.
        An item taken but not written when the socket fails is kept for a resume."""
        driver, ws, fast = self.driver, self.ws, self.fast
        outbox = self.session.outbox
        while True:
            item = driver.unsent
            if item is None:
                item = await outbox.next()
                if item is None:
                    break
                driver.unsent = item
            try:
                message = item if isinstance(item, bytes) else encode_event(item)
            except (TypeError, ValueError):
                await self._unsendable(event_type(item))  # type: ignore[arg-type]
                return
            try:
                if isinstance(message, bytes):
                    await ws.send_bytes(message)
                else:
                    await write_text(ws, fast, message)
            except (RuntimeError, OSError, WebSocketDisconnect):
                self.client_left = True
                return
            driver.unsent = None
        await close_ended(ws, self.session.end_reason)

    async def _unsendable(self, event_type: str) -> None:
        """An event that cannot be encoded (a bug: client text is checked on the way in)
        ends the session the documented way: `internal`, `session.ended`, close 1011; the
        client is never left with a dropped connection (1006) and no goodbye."""
        log.error("event could not be encoded; session ended", extra={"event": event_type})
        goodbye = self.driver.end_now(internal_error())
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
            for event in goodbye:
                await self.ws.send_text(encode_event(event))
            await self.ws.close(CLOSE_INTERNAL)


# -- the way out, as every WebSocket wire writes it (/v1/stream, /v1/realtime) ------------


async def write_text(ws: WebSocket, fast: FastPath | None, text: str) -> None:
    """A text message, written by the protocol at once when nothing has to wait
    (ws_send.DirectSendProtocol.send_text), else through the ASGI send."""
    if fast is not None and fast.send_text is not None and fast.send_text(text):
        fast.sent_direct += 1
    else:
        await ws.send_text(text)


async def close_ended(ws: WebSocket, end_reason: str) -> None:
    """The session is over and its output sent: close 1011 if it ended `internal`, else
    1000; a socket already gone is no error."""
    internal = end_reason == ErrorCode.INTERNAL
    with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
        await ws.close(CLOSE_INTERNAL if internal else CLOSE_NORMAL)


async def close_stalled(driver: SessionDriver, ws: WebSocket, fast: FastPath | None) -> None:
    """A client that reads nothing cannot be told in-band: close with 1008 and the code
    as the reason. The protocol closes without waiting for its buffer to drain (it never
    would); elsewhere the ASGI close gets a second."""
    driver.end_stalled()
    if fast is not None and fast.close_stalled is not None:
        fast.close_stalled()
        return
    with contextlib.suppress(RuntimeError, WebSocketDisconnect, TimeoutError, OSError):
        async with asyncio.timeout(1.0):
            await ws.close(CLOSE_POLICY, reason=ErrorCode.CLIENT_STALLED.value)

"""WebSocket /v1/stream: the thin adapter between the wire (ws_protocol) and a Session.

Three tasks per connection, owned here: the receiver (socket -> session), the session's own
pipeline, and the sender (outbox -> socket). Whichever ends first decides: a client that
leaves cancels the pipeline (and with it queued model work); a finished session closes the
socket with 1000.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from voxserve.errors import ErrorCode, VoxError
from voxserve.observe.logs import bind_session
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.session import Session
from voxserve.runtime import Runtime
from voxserve.server.admission import admit
from voxserve.server.auth import (
    SUBPROTOCOL,
    KeyRing,
    bearer_token,
    origin_allowed,
    subprotocol_token,
)
from voxserve.server.ws_protocol import (
    CancelMessage,
    EndMessage,
    MarkMessage,
    StartMessage,
    TextMessage,
    encode_event,
    parse_audio_frame,
    parse_text_message,
)

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008  # the client broke the protocol
CLOSE_INTERNAL = 1011
CLOSE_TRY_AGAIN = 1013  # overloaded or not ready: retry later


def routes(runtime: Runtime) -> list[BaseRoute]:
    keys = KeyRing.from_settings(runtime.settings)

    async def endpoint(websocket: WebSocket) -> None:
        await StreamConnection(runtime, websocket, keys).serve()

    return [WebSocketRoute("/v1/stream", endpoint)]


class StreamConnection:
    def __init__(self, runtime: Runtime, websocket: WebSocket, keys: KeyRing) -> None:
        self.runtime = runtime
        self.ws = websocket
        self.limits = runtime.settings.limits
        self._closing = False  # a fatal error ended the session; input is ignored
        self._last_message_at = time.monotonic()
        self.keys = keys
        self.key_id: str | None = None

    async def serve(self) -> None:
        # Accepted before any check, so a refused client reads why (an error event and a
        # close code) instead of a bare HTTP 403. `voxserve.v1` is selected when offered:
        # never the bearer subprotocol, whose name carries the key.
        offered = self.ws.scope.get("subprotocols") or []
        await self.ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        try:
            session = await self._open_session()
        except VoxError as exc:
            metrics = self.runtime.metrics
            metrics.errors.labels(exc.code.value, "ws").inc()
            metrics.refused.labels(exc.code.value).inc()
            await self._fail(exc)
            return
        except WebSocketDisconnect:
            return
        mode = session.config.mode
        metrics = self.runtime.metrics
        metrics.sessions_total.labels(mode).inc()
        active = metrics.sessions_active.labels(mode)
        active.inc()
        self.runtime.active_sessions += 1
        try:
            await self._run(session)
        finally:
            self.runtime.active_sessions -= 1
            active.dec()
            metrics.session_counts(session.ended_event())

    def _authenticate(self) -> None:
        """Origin first (a browser page of another site must not use the key a user
        typed elsewhere), then the key: header, else the bearer subprotocol."""
        headers = self.ws.headers
        origin = headers.get("origin")
        allowed = self.runtime.settings.cors_allowed_origins
        if origin is not None and not origin_allowed(origin, headers.get("host", ""), allowed):
            raise VoxError(
                ErrorCode.ORIGIN_NOT_ALLOWED,
                f"origin {origin!r} is not allowed (cors_allowed_origins)",
                fatal=True,
            )
        token = bearer_token(headers.get("authorization"))
        if token is None:
            token = subprotocol_token(self.ws.scope.get("subprotocols") or [])
        self.key_id = self.keys.authenticate(token)

    async def _open_session(self) -> Session:
        self._authenticate()
        admit(self.runtime)
        timeout_s = self.limits.handshake_timeout_s
        try:
            message = await asyncio.wait_for(self.ws.receive(), timeout_s)
        except TimeoutError:
            raise VoxError(
                ErrorCode.NOT_STARTED, f"no session.start within {timeout_s:g} s", fatal=True
            ) from None
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        if message.get("text") is None:
            raise VoxError(
                ErrorCode.NOT_STARTED, "the first message must be a session.start", fatal=True
            )
        parsed = self._parse_fatal(message["text"])
        if not isinstance(parsed, StartMessage):
            raise VoxError(
                ErrorCode.NOT_STARTED, "the first message must be a session.start", fatal=True
            )
        outbox = Outbox(self.runtime.settings.pipeline.outbox_messages)
        try:
            return Session(self.runtime, parsed.config, outbox)
        except VoxError as exc:
            exc.fatal = True
            raise

    def _parse_fatal(self, text: str) -> Any:
        try:
            return parse_text_message(text, self.limits.max_message_bytes)
        except VoxError as exc:
            exc.fatal = True
            raise

    async def _run(self, session: Session) -> None:
        # Every log line of this connection's tasks (created below, so they copy this
        # context) carries the trace and session ids; never the audio or the text.
        bind_session(session.trace_id, session.id)
        await self.ws.send_text(encode_event(session.started_event()))
        log.info("session started", extra={"mode": session.config.mode})
        pipeline = asyncio.create_task(self._pipeline(session), name="voxserve-session")
        sender = asyncio.create_task(self._send(session.outbox), name="voxserve-sender")
        receiver = asyncio.create_task(self._receive(session), name="voxserve-receiver")
        limits = asyncio.create_task(self._watch_limits(session), name="voxserve-limits")
        tasks = {pipeline, sender, receiver, limits}
        try:
            await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(
                result, asyncio.CancelledError | WebSocketDisconnect
            ):
                log.error("session task failed", exc_info=result)
        log.info("session closed")

    async def _pipeline(self, session: Session) -> None:
        try:
            await session.run()
        except VoxError as exc:
            exc.fatal = True
            await session.outbox.event(exc.to_event())
            await session.outbox.event(session.ended_event())
            await session.outbox.close()
        except Exception:
            log.exception("session pipeline failed")
            error = VoxError(ErrorCode.INTERNAL, "internal error; see server logs", fatal=True)
            error_event = error.to_event() | {"trace_id": session.trace_id}
            session.outbox.event_nowait(error_event)
            session.outbox.event_nowait(session.ended_event())
            await session.outbox.close()

    async def _send(self, outbox: Outbox) -> None:
        """Drain the outbox into the socket; ends the connection when the session is over."""
        while (item := await outbox.next()) is not None:
            if isinstance(item, bytes):
                await self.ws.send_bytes(item)
            else:
                await self.ws.send_text(encode_event(item))
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await self.ws.close(CLOSE_NORMAL)

    async def _receive(self, session: Session) -> None:
        """Read client messages until it disconnects; errors in one message are reported and
        the session goes on, fatal ones end it."""
        max_frame_ms = self.limits.max_frame_ms
        rate = session.config.sample_rate
        while True:
            message = await self.ws.receive()
            self._last_message_at = time.monotonic()  # read by _watch_limits
            if message["type"] == "websocket.disconnect":
                return
            if self._closing:
                continue  # a fatal error was sent; the sender closes the socket after it
            data = message.get("bytes")
            try:
                if data is not None:
                    try:
                        seq, pcm = parse_audio_frame(data, rate, max_frame_ms)
                    except VoxError:
                        session.rejected += 1
                        raise
                    await session.feed_audio(seq, pcm)
                    continue
                parsed = parse_text_message(
                    message.get("text") or "", self.limits.max_message_bytes
                )
                if isinstance(parsed, TextMessage):
                    await session.feed_text(parsed.text, flush=parsed.flush)
                elif isinstance(parsed, EndMessage):
                    await session.end_input()
                elif isinstance(parsed, CancelMessage):
                    await session.cancel()
                elif isinstance(parsed, MarkMessage):
                    await session.mark(parsed.id)
                elif isinstance(parsed, StartMessage):
                    raise VoxError(ErrorCode.ALREADY_STARTED, "the session has already started")
            except VoxError as exc:
                self.runtime.metrics.errors.labels(exc.code.value, "ws").inc()
                await session.outbox.event(exc.to_event())
                if exc.fatal:
                    await self._end_fatally(session, None)

    def _limit_error(self, *, expired: bool) -> VoxError:
        if expired:
            limit = self.limits.max_session_s
            return VoxError(
                ErrorCode.SESSION_EXPIRED, f"sessions last at most {limit:g} s", fatal=True
            )
        idle = self.limits.idle_timeout_s
        return VoxError(
            ErrorCode.IDLE_TIMEOUT, f"no message from the client for {idle:g} s", fatal=True
        )

    async def _watch_limits(self, session: Session) -> None:
        """End a session whose client went silent (`limits.idle_timeout_s`) or that has
        lasted `limits.max_session_s`. A task of its own, so the receive path pays one clock
        read per message, not a timer."""
        idle = self.limits.idle_timeout_s
        expires_at = time.monotonic() + self.limits.max_session_s
        while not self._closing:
            now = time.monotonic()
            if now >= expires_at:
                await self._end_fatally(session, self._limit_error(expired=True))
                return
            if now - self._last_message_at >= idle:
                await self._end_fatally(session, self._limit_error(expired=False))
                return
            await asyncio.sleep(min(expires_at, self._last_message_at + idle) - now + 0.001)

    async def _end_fatally(self, session: Session, error: VoxError | None) -> None:
        """After a fatal error: report it (unless already sent), then the counters, then
        close; the sender closes the socket once these are out."""
        if self._closing:
            return
        self._closing = True
        if error is not None:
            self.runtime.metrics.errors.labels(error.code.value, "ws").inc()
            await session.outbox.event(error.to_event())
        await session.outbox.event(session.ended_event())
        await session.outbox.close()

    async def _fail(self, error: VoxError) -> None:
        """Refuse a connection that never became a session, with a code for the transport."""
        code = (
            CLOSE_TRY_AGAIN
            if error.code in (ErrorCode.OVERLOADED, ErrorCode.NOT_READY)
            else CLOSE_POLICY
        )
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            event = error.to_event()
            if code == CLOSE_TRY_AGAIN:
                event["retry_after_ms"] = 1000
            await self.ws.send_text(encode_event(event))
            await self.ws.close(code, reason=error.code.value)

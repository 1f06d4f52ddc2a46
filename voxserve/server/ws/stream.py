"""WebSocket /v1/stream: the handshake of a connection, then its session's driver.

Accepted, then refused or admitted: the origin and key, the global rule, then the first
message: a `session.start` opens a session (the key's quotas), a `session.resume` takes
back a parked one. The session is served through the connection's link (websocket/link.py) by
its driver (session/driver.py). When the connection ends, a resumable session whose
client dropped is parked for `limits.resume_window_s`; any other is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from voxserve.errors import ErrorCode, VoxError
from voxserve.events import ClientMessage, ResumeMessage, StartMessage
from voxserve.runtime import Runtime
from voxserve.server.session.admission import admit
from voxserve.server.session.auth import (
    ANONYMOUS,
    SUBPROTOCOL,
    KeyRing,
    bearer_token,
    check_origin,
    subprotocol_token,
)
from voxserve.server.session.driver import SessionDriver
from voxserve.server.session.input import Wire
from voxserve.server.session.parking import ParkedSessions, parkable
from voxserve.server.session.slot import count_refusal
from voxserve.server.session.stream_protocol import encode_event, parse_text_message
from voxserve.server.websocket.close_codes import refusal
from voxserve.server.websocket.fastpath import FastPath, fast_path_of
from voxserve.server.websocket.link import SessionLink

log = logging.getLogger(__name__)

WEBSOCKET = Wire("ws", in_band_end=True, stalls=True, tasks="voxserve")


def routes(runtime: Runtime) -> list[BaseRoute]:
    keys = KeyRing.from_settings(runtime.settings)
    parked = ParkedSessions()  # sessions whose client dropped, waiting for session.resume

    async def endpoint(websocket: WebSocket) -> None:
        await StreamConnection(runtime, websocket, keys, parked).serve()

    return [WebSocketRoute("/v1/stream", endpoint)]


class StreamConnection:
    def __init__(
        self, runtime: Runtime, websocket: WebSocket, keys: KeyRing, parked: ParkedSessions
    ) -> None:
        self.runtime = runtime
        self.ws = websocket
        self.limits = runtime.settings.limits
        self.parked = parked
        self.opened_at = time.monotonic()
        self.keys = keys
        self.key_id: str | None = None
        self.fast: FastPath | None = fast_path_of(websocket.scope)

    async def serve(self) -> None:
        # Accepted before any check, so a refused client reads why (an error event and a
        # close code) instead of a bare HTTP 403. `voxserve.v1` is selected when offered:
        # never the bearer subprotocol, whose name carries the key.
        offered = self.ws.scope.get("subprotocols") or []
        await self.ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        try:
            driver, resumed = await self._open_session()
        except VoxError as exc:
            count_refusal(self.runtime, exc, WEBSOCKET.name)
            await self._fail(exc)
            return
        except WebSocketDisconnect:
            return
        if not resumed:
            driver.start()
        link = SessionLink(self.ws, self.fast, driver, self.limits)
        try:
            await link.run(self.runtime.metrics, resumed=resumed, since=self.opened_at)
        finally:
            window = self.limits.resume_window_s
            if link.client_left and window > 0 and parkable(driver):
                self.parked.park(driver, window)
            else:
                driver.close()
                await driver.wait_closed()

    def _authenticate(self) -> None:
        """Origin first (a browser page of another site must not use the key a user
        typed elsewhere), then the key: header, else the bearer subprotocol."""
        headers = self.ws.headers
        origin = headers.get("origin")
        allowed = self.runtime.settings.cors_allowed_origins
        check_origin(origin, headers.get("host", ""), allowed, fatal=True)
        token = bearer_token(headers.get("authorization"))
        if token is None:
            token = subprotocol_token(self.ws.scope.get("subprotocols") or [])
        self.key_id = self.keys.authenticate(token)

    async def _open_session(self) -> tuple[SessionDriver, bool]:
        """Authenticate and admit (the global rule), read the first message, then either
        hand back the parked session it resumes or open a new one (the key's quotas)."""
        self._authenticate()
        # Refused before the first message is read, so a refused client learns it at once.
        admit(self.runtime, parked=len(self.parked), stream=True)
        first = await self._first_message()
        if isinstance(first, ResumeMessage):
            return self.parked.take(first.session_id, self.key_id), True
        # Per-key quotas after the global rule: refused at open, before any audio.
        driver = await SessionDriver.open_with_model(
            self.runtime,
            first.config,
            wire=WEBSOCKET,
            principal=self.key_id or ANONYMOUS,
            owner=self.key_id,
        )
        return driver, False

    async def _first_message(self) -> StartMessage | ResumeMessage:
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
        if not isinstance(parsed, StartMessage | ResumeMessage):
            raise VoxError(
                ErrorCode.NOT_STARTED, "the first message must be a session.start", fatal=True
            )
        return parsed

    def _parse_fatal(self, text: str) -> ClientMessage:
        try:
            return parse_text_message(
                text, self.limits.max_message_bytes, self.limits.max_json_depth
            )
        except VoxError as exc:
            exc.fatal = True
            raise

    async def _fail(self, error: VoxError) -> None:
        """Refuse a connection that never became a session, with a code for the transport."""
        event, code = refusal(error)
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await self.ws.send_text(encode_event(event))
            await self.ws.close(code, reason=error.code.value)

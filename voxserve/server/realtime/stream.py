"""WebSocket /v1/realtime: the OpenAI Realtime API's doorway onto the session driver.

Accepted, then refused or opened at once: the origin and key (the `Authorization` header,
or the `openai-insecure-api-key.<key>` subprotocol browsers send; the key may be a client
secret `ek_...`, used up here, whose session object becomes the initial settings:
server/realtime_api/secrets.py), the global rule, the key's quotas. Unlike /v1/stream the
session opens before the client says anything:
Realtime's first event is the server's `session.created`, and `session.update` changes it
later (the codec turns it into a `SessionUpdate`). The wire's own parts are the codec's
(server/realtime_api/codec.py decodes client events into frames and messages,
server/realtime_api/events.py encodes server events); this module is the handshake, then
`RealtimeLink`: the way in, the sender and the close. A refusal is an `error` event, then close
1013 (try again: overloaded, not ready, over quota, shutting down) or 1008.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time

from starlette.routing import BaseRoute, WebSocketRoute
from starlette.types import Message  # an ASGI websocket.receive message
from starlette.websockets import WebSocket, WebSocketDisconnect

from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.pipeline.outbox import Outgoing
from voxserve.runtime import Runtime
from voxserve.server.realtime_api.codec import RealtimeDecoder
from voxserve.server.realtime_api.events import RealtimeEncoder
from voxserve.server.realtime_api.origins import ErrorOrigins
from voxserve.server.realtime_api.responses import request_limits
from voxserve.server.realtime_api.secrets import (
    ClientSecrets,
    apply_session,
    realtime_principal,
    secrets_of,
    session_kind,
)
from voxserve.server.realtime_api.session import (
    BETA_SUBPROTOCOL,
    FORMAT_RATES,
    KEY_SUBPROTOCOL_PREFIX,
    SUBPROTOCOL,
    Installed,
    Kind,
    RealtimeWire,
    initial_wire,
    installed_of,
)
from voxserve.server.session.admission import admit
from voxserve.server.session.attachment import serve_attached
from voxserve.server.session.auth import ANONYMOUS, KeyRing, bearer_token, check_origin
from voxserve.server.session.driver import SessionDriver
from voxserve.server.session.events import internal_error
from voxserve.server.session.input import Decoded, InputEnd, Wire
from voxserve.server.session.quotas import quotas_of
from voxserve.server.session.request_id import trace_id_of
from voxserve.server.session.slot import count_refusal
from voxserve.server.websocket.close_codes import CLOSE_INTERNAL, refusal
from voxserve.server.websocket.fastpath import FastPath, fast_path_of
from voxserve.server.websocket.link import close_ended, close_stalled, write_text
from voxserve.types import SAMPLE_RATE

log = logging.getLogger(__name__)

REALTIME = Wire("realtime", in_band_end=True, stalls=True, tasks="voxserve-realtime")
# Text messages up to this many times limits.max_message_bytes are read and refused with
# an error event (the connection goes on); past it the WebSocket layer closes with 1009.
OVERSIZE_READ = 4
MAX_MODEL = 128  # `?model=`, reported back in the session object as given
# An append as clients write it (the type first): what the fast path may hold (ws_fastpath).
_APPEND = re.compile(rb'\{\s*"type"\s*:\s*"input_audio_buffer\.append"')


def is_append(payload: bytes) -> bool:
    """Whether a text message is an `input_audio_buffer.append` (any other event is never held
    back: it may be one the client then waits on)."""
    return _APPEND.match(payload) is not None


def routes(runtime: Runtime) -> list[BaseRoute]:
    keys = KeyRing.from_settings(runtime.settings)
    secrets = secrets_of(runtime)

    async def endpoint(websocket: WebSocket) -> None:
        await RealtimeConnection(runtime, websocket, keys, secrets).serve()

    return [WebSocketRoute("/v1/realtime", endpoint)]


def key_subprotocol(offered: list[str]) -> str | None:
    """The key of an ``openai-insecure-api-key.<key>`` subprotocol, if one is offered."""
    for protocol in offered:
        if protocol.startswith(KEY_SUBPROTOCOL_PREFIX):
            return protocol[len(KEY_SUBPROTOCOL_PREFIX) :] or None
    return None


class RealtimeConnection:
    def __init__(
        self, runtime: Runtime, websocket: WebSocket, keys: KeyRing, secrets: ClientSecrets
    ) -> None:
        self.runtime = runtime
        self.ws = websocket
        self.keys = keys
        self.secrets = secrets
        self.limits = runtime.settings.limits
        self.opened_at = time.monotonic()
        self.fast: FastPath | None = fast_path_of(websocket.scope)
        query = websocket.query_params
        self.offered = list(websocket.scope.get("subprotocols") or [])
        beta = "realtime=v1" in (websocket.headers.get("openai-beta") or "").replace(" ", "")
        self.beta = beta or BETA_SUBPROTOCOL in self.offered
        self.model = query.get("model") or ""
        self.intent = query.get("intent")
        # The codec's shared state: a bare one (no engines known yet) until the session opens.
        self.wire: RealtimeWire = initial_wire(Installed((), ""), model=self.model, beta=self.beta)

    async def serve(self) -> None:
        if self.fast is not None and self.fast.set_max_size is not None:
            # Oversized events are refused in-band, not by a close (module constants).
            self.fast.set_max_size(self.limits.max_message_bytes * OVERSIZE_READ)
        await self.ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in self.offered else None)
        try:
            driver = await self._open()
        except VoxError as exc:
            count_refusal(self.runtime, exc, REALTIME.name)
            await self._refuse(exc)
            return
        driver.start()
        try:
            await RealtimeLink(self, driver).run()
        finally:
            driver.close()
            await driver.wait_closed()

    async def _open(self) -> SessionDriver:
        """Origin, key, the global rule, then the session (the key's quotas): all before
        the client's first event, so a refused client learns it at once."""
        headers = self.ws.headers
        allowed = self.runtime.settings.cors_allowed_origins
        check_origin(headers.get("origin"), headers.get("host", ""), allowed, fatal=True)
        if len(self.model) > MAX_MODEL:
            raise VoxError(
                ErrorCode.INVALID_PARAMETER,
                f"model is longer than {MAX_MODEL} characters",
                fatal=True,
            )
        if self.intent not in (None, "", "transcription"):
            raise VoxError(
                ErrorCode.INVALID_PARAMETER,
                f"intent {quoted(self.intent)} is not known: transcription, or none",
                fatal=True,
            )
        # A client secret is used up here (after the checks above, which cost it nothing);
        # the session object it carries is the settings session.created reports.
        token = bearer_token(headers.get("authorization")) or key_subprotocol(self.offered)
        key_id, session = realtime_principal(self.keys, self.secrets, token)
        runtime = self.runtime
        admit(runtime, stream=True)
        intent: Kind = "transcription" if self.intent == "transcription" else "realtime"
        kind = session_kind(session, intent)
        present = installed_of(
            runtime.engines, runtime.settings.vad, runtime.settings.tts.openai_voices
        )
        # The session's trace id is the handshake's x-request-id (server/session/request_id.py).
        trace_id = trace_id_of(self.ws.scope)
        wire = initial_wire(present, model=self.model, kind=kind, beta=self.beta, trace_id=trace_id)
        if session is not None:
            apply_session(wire, session)
        self.wire = wire
        return await SessionDriver.open_with_model(  # a client secret's transcription model
            runtime,
            wire.config(),
            wire=REALTIME,
            principal=key_id or ANONYMOUS,
            owner=key_id,
        )

    async def _refuse(self, error: VoxError) -> None:
        event, code = refusal(error)
        encoder = RealtimeEncoder(self.wire)
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
            for text in encoder.encode(event):
                await self.ws.send_text(text)
            await self.ws.close(code, reason=error.code.value)


class RealtimeLink:
    """One connection serving its session: the way in (session_input.ClientInput), the
    sender, the close."""

    def __init__(self, connection: RealtimeConnection, driver: SessionDriver) -> None:
        self.ws = connection.ws
        self.fast = connection.fast
        self.limits = connection.limits
        self.opened_at = connection.opened_at
        self.driver = driver
        self.session = driver.session
        wire, limits = connection.wire, connection.limits
        quotas, principal = quotas_of(connection.runtime), driver.slot.quota.principal
        self.encoder = RealtimeEncoder(wire, lambda: request_limits(quotas, principal))
        self.decoder = RealtimeDecoder(wire, limits.max_message_bytes, limits.max_json_depth)
        self.origins = ErrorOrigins(self.session.outbox)

    async def run(self) -> None:
        driver = self.driver
        driver.announce()
        try:
            for text in self.encoder.encode(self.session.started_event()):  # session.created
                await self.ws.send_text(text)
        except (RuntimeError, OSError, WebSocketDisconnect):
            return  # the client left at once
        fast = self.fast
        if fast is not None:  # the protocol watches that the client reads (websocket/stall.py)
            fast.stall_s = self.limits.stalled_client_s
            fast.on_stall = driver.client_stalled
            fast.holds_text = self._holdable  # appends are held and queued together
        try:
            await serve_attached(driver, self, self._send(), since=self.opened_at)
        finally:
            if fast is not None:
                fast.on_stall = fast.stall_s = None
                fast.holds_text, fast.open = None, False
                if fast.hand_over is not None:
                    fast.hand_over()
        if self.session.outbox.stalled:
            await close_stalled(driver, self.ws, fast)

    # -- the way in ------------------------------------------------------------------------

    def _holdable(self, payload: bytes) -> bool:
        """An append the decoder will take (a refused one is not held: its error comes at
        once)."""
        return is_append(payload) and self.decoder.holdable(payload)

    async def receive(self) -> Message | InputEnd:
        self.origins.end(self.decoder.last_event_id)  # the last message's reports are queued
        fast = self.fast
        if fast is None:
            message = await self.ws.receive()
        else:
            fast.hold_text = self._text_wanted_in()
            fast.open = True  # appends may be held while we wait (websocket/fastpath.py)
            try:
                message = await self.ws.receive()
            finally:
                fast.open = False
        if message["type"] == "websocket.disconnect":
            return InputEnd.GONE
        return message

    def decode(self, message: Message) -> Decoded:
        """A client event (text); binary messages are not Realtime's (non-fatal)."""
        self.origins.begin()
        text = message.get("text")
        if text is None:
            self.decoder.last_event_id = None
            raise VoxError(
                ErrorCode.INVALID_MESSAGE,
                "binary messages are not part of the Realtime API: send audio as "
                "input_audio_buffer.append events",
            )
        return self.decoder.decode(text)

    def release(self) -> None:
        """The fast path queues the appends it holds, then holds no more than the session
        now wants."""
        fast = self.fast
        if fast is not None:
            if fast.hand_over is not None:
                fast.hand_over()
            fast.hold_text = self._text_wanted_in()

    def _text_wanted_in(self) -> int:
        """`Session.audio_wanted_in` (samples at the pipeline's rate) as base64 bytes of the
        input format: how much append text the fast path may hold."""
        fmt = self.decoder.wire.latest.input_format
        rate = FORMAT_RATES[fmt]
        width = 2 if fmt == "audio/pcm" else 1  # G.711: a byte a sample
        return self.session.audio_wanted_in() * rate // SAMPLE_RATE * width * 4 // 3

    # -- the way out -----------------------------------------------------------------------

    def _encode(self, item: Outgoing) -> list[str]:
        if isinstance(item, bytes):
            return self.encoder.encode_audio(item)
        return self.origins.tie(item, self.encoder.encode(item))

    async def _send(self) -> None:
        """Drain the outbox into the socket (each item as the events the codec makes of
        it); ends the connection when the session is over."""
        driver, ws, fast = self.driver, self.ws, self.fast
        outbox = self.session.outbox
        while (item := await outbox.next()) is not None:
            driver.unsent = item  # the driver's rule; a Realtime session is never resumed
            try:
                texts = self._encode(item)
            except (TypeError, ValueError):
                await self._unsendable()
                return
            try:
                for text in texts:
                    await write_text(ws, fast, text)
            except (RuntimeError, OSError, WebSocketDisconnect):
                return
            driver.unsent = None
        await close_ended(ws, self.session.end_reason)

    async def _unsendable(self) -> None:
        """An event the codec cannot encode (a bug): `internal`, then close 1011."""
        log.error("event could not be encoded; session ended")
        goodbye = self.driver.end_now(internal_error())
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect, TypeError, ValueError):
            for event in goodbye:
                for text in self.encoder.encode(event):
                    await self.ws.send_text(text)
            await self.ws.close(CLOSE_INTERNAL)

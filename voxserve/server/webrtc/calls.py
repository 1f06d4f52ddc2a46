"""POST /v1/realtime/calls: a WebRTC call onto a Realtime session, as OpenAI's
(`client.realtime.calls.create(sdp=..., session=...)`); DELETE /v1/realtime/calls/{id} and
POST .../{id}/hangup end it.

The offer comes as `Content-Type: application/sdp`, or as a multipart form with `sdp` and
`session` (a Realtime session object, applied as the first settings: session.created
already reports them). Everything that may refuse the call happens before the answer, as
HTTP errors: the key (or a client secret), the offer, the global rule and the key's quotas
(503/429 with Retry-After), the UDP ports. Then 201 with the SDP answer and
`Location: /v1/realtime/calls/rtc_<session id>`; the call runs in a task: it waits for
the `oai-events` channel (webrtc.connect_timeout_s), runs the link (session events on the
channel, audio on the tracks) until the session ends or the peer is gone (ICE, media
timeout, a hang-up), and frees everything. aiortc is imported when the first call comes:
without the `webrtc` extra the route answers 501 webrtc_unavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib
import logging
from types import ModuleType
from typing import TYPE_CHECKING, Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.runtime import Runtime
from voxserve.server.realtime_api.secrets import (
    apply_session,
    is_client_secret,
    realtime_principal,
    secrets_of,
    session_kind,
)
from voxserve.server.realtime_api.session import (
    Installed,
    RealtimeWire,
    initial_wire,
    installed_of,
)
from voxserve.server.realtime_api.update import speaks_beta
from voxserve.server.session.admission import admit
from voxserve.server.session.auth import ANONYMOUS, KeyRing, bearer_token, digest
from voxserve.server.session.driver import SessionDriver
from voxserve.server.session.http_requests import guarded, read_form
from voxserve.server.session.json_input import decode_json
from voxserve.server.session.slot import count_refusal
from voxserve.server.webrtc.link import WEBRTC, WebRtcLink
from voxserve.server.webrtc.ports import PortRange
from voxserve.server.webrtc.registry import CallRegistry, LiveCall

if TYPE_CHECKING:  # imports aiortc: loaded by peer_module() when a call comes
    from voxserve.server.webrtc.peer import Peer

log = logging.getLogger(__name__)

SDP_TYPE = "application/sdp"
FORM_TYPE = "multipart/form-data"
MAX_BODY = 256 * 1024  # an offer (a few kB) and a session object
CALL_PREFIX = "rtc_"
HANG_UP_WAIT_S = 5.0  # a hang-up answers once the call is freed, or after this long
LINK_END_WAIT_S = 5.0  # after the peer is gone, the link's goodbye gets this long


def peer_module() -> ModuleType:
    """voxserve.server.webrtc.peer (which imports aiortc, and the media modules that do);
    `webrtc_unavailable` without the extra."""
    try:
        return importlib.import_module("voxserve.server.webrtc.peer")
    except ImportError as exc:
        raise VoxError(
            ErrorCode.WEBRTC_UNAVAILABLE,
            f"WebRTC needs the webrtc extra (aiortc), which is not installed: "
            f"pip install 'voxserve[webrtc]' ({exc.name or 'aiortc'} missing)",
        ) from None


async def read_offer(request: Request, limit: int, depth: int) -> tuple[str, dict[str, Any]]:
    """(the SDP offer, the session object or {}) of a raw `application/sdp` body or a form
    with `sdp` and `session` (what the openai SDK sends)."""
    declared = request.headers.get("content-type", "")
    media_type = declared.partition(";")[0].strip().lower()
    if media_type == SDP_TYPE:
        body = await _read_capped(request, limit)
        return _text(body, "the SDP offer", ErrorCode.INVALID_SDP), {}
    if media_type != FORM_TYPE:
        raise VoxError(
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            f"send the SDP offer as Content-Type: {SDP_TYPE}, or a {FORM_TYPE} form with "
            f"sdp and session, not {quoted(declared)}",
        )
    form = await read_form(request, limit, max_files=2)
    sdp = await _field(form.get("sdp"), "the form's sdp", ErrorCode.INVALID_SDP)
    if sdp is None:
        raise VoxError(ErrorCode.INVALID_SDP, "the form has no sdp field (the SDP offer)")
    raw_session = await _field(
        form.get("session"), "the form's session", ErrorCode.INVALID_PARAMETER
    )
    if raw_session is None:
        return sdp, {}
    session = decode_json(raw_session, max_bytes=limit, max_depth=depth, what="session")
    if not isinstance(session, dict):
        raise VoxError(ErrorCode.INVALID_PARAMETER, "session must be a JSON object")
    return sdp, session


async def _read_capped(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise VoxError(
                ErrorCode.MESSAGE_TOO_LARGE, f"request body is larger than {limit} bytes"
            )
        chunks.append(chunk)
    return b"".join(chunks)


async def _field(value: str | UploadFile | None, what: str, code: ErrorCode) -> str | None:
    """A form field's text; `code` when a file part is not UTF-8 (its client-chosen
    filename is not echoed)."""
    if value is None or isinstance(value, str):
        return value
    return _text(await value.read(), what, code)


def _text(raw: bytes, what: str, code: ErrorCode) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise VoxError(code, f"{what} is not UTF-8 text") from None


def call_wire(
    installed: Installed, secret_session: dict[str, Any] | None, session: dict[str, Any]
) -> RealtimeWire:
    """The Realtime state a call opens with: track media, then the session objects (a client
    secret's, then the request's `session` field; GA or beta names) applied in turn as the
    first settings, each checked in full (a 400 now, not a dead call later)."""
    given = [s for s in (secret_session, session) if s]
    kind = session_kind(secret_session, session_kind(session or None, "realtime"))
    beta = any(speaks_beta(s) for s in given)
    wire = initial_wire(installed, model="", kind=kind, beta=beta, media="track")
    for each in given:
        apply_session(wire, each)
    return wire


class Call:
    """One live call: its peer, its session, the task that runs them (module docstring)."""

    def __init__(
        self,
        service: CallService,
        driver: SessionDriver,
        wire: RealtimeWire,
        peer: Peer,
    ) -> None:
        self.service = service
        self.driver = driver
        self.wire = wire
        self.peer = peer
        self.call_id = CALL_PREFIX + driver.id
        self.owner = driver.owner or ANONYMOUS
        self.secret_digest: bytes | None = None  # the client secret that made it, if one
        self.link: WebRtcLink | None = None
        self.task: asyncio.Task[None] | None = None
        self._hung_up = False
        self._ended = asyncio.Event()

    def hang_up(self) -> None:
        """End the call (DELETE, hangup, shutdown): the link's input ends (GONE)."""
        self._hung_up = True
        self.peer.gone.set()
        if self.link is not None:
            self.link.hang_up()

    async def wait_ended(self) -> None:
        await self._ended.wait()

    async def run(self) -> None:
        try:
            if await self._connected():
                await self._serve()
            elif not self._hung_up:
                log.info("call never connected", extra={"call_id": self.call_id})
        except Exception:
            log.exception("call failed")
        finally:
            await self._free()

    async def _connected(self) -> bool:
        """The channel is open within connect_timeout_s (a session that ends first, as in a
        drain, ends the wait)."""
        timeout = self.service.runtime.settings.webrtc.connect_timeout_s
        waiting = asyncio.ensure_future(self.peer.connected(timeout))
        pipeline = self.driver.pipeline
        waits: list[asyncio.Future[Any]] = [waiting] if pipeline is None else [waiting, pipeline]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done():
            waiting.cancel()
            return False
        return bool(waiting.result())

    async def _serve(self) -> None:
        peer = self.peer
        inbound, channel = peer.inbound, peer.channel
        assert channel is not None  # connected(): the channel is open
        runtime = self.service.runtime
        # The link listens to the channel from its construction; what came before is
        # handed over in the same step (no await between).
        self.link = link = WebRtcLink(
            self.driver,
            self.wire,
            channel,
            inbound,
            peer.outbound,
            runtime,
            pending=peer.take_early(),
            dropped=peer.early_dropped,
        )
        if self._hung_up:
            link.hang_up()
        running = asyncio.ensure_future(link.run())
        gone = asyncio.ensure_future(peer.gone.wait())
        silent = asyncio.ensure_future(peer.watch_media())
        try:
            await asyncio.wait([running, gone, silent], return_when=asyncio.FIRST_COMPLETED)
            if not running.done():
                why = "hang-up" if self._hung_up else "gone" if gone.done() else "no media"
                log.info("call peer gone", extra={"call_id": self.call_id, "why": why})
                link.hang_up()
                await asyncio.wait([running], timeout=LINK_END_WAIT_S)
                if not peer.lost:  # ended from this side: the caller is told, as a
                    link.say_ended()  # session that ends on its own tells it
        finally:
            for task in (running, gone, silent):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running

    async def _free(self) -> None:
        """The peer (its ports), the session, the registry: given back, once."""
        with contextlib.suppress(Exception):
            await self.peer.close()
        self.driver.close()
        await self.driver.wait_closed()
        self.service.registry.remove(self)
        self._ended.set()


class CallService:
    """The call routes of one app, its live calls and its port range."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.keys = KeyRing.from_settings(runtime.settings)
        self.registry = CallRegistry()
        config = runtime.settings.webrtc
        self.ports = PortRange(config.port_min, config.port_max)

    def routes(self) -> list[BaseRoute]:
        if not self.runtime.settings.webrtc.enabled:
            return []  # 404, as an unknown path
        # aiortc and PyAV load now, as the app is built: imported by the first call they
        # would stall the event loop, and every live session with it, for ~1 s.
        with contextlib.suppress(VoxError):  # not installed: calls answer 501
            peer_module()
        return [
            Route("/v1/realtime/calls", guarded(self.create), methods=["POST"]),
            Route("/v1/realtime/calls/{call_id}", guarded(self.delete), methods=["DELETE"]),
            Route("/v1/realtime/calls/{call_id}/hangup", guarded(self.hangup), methods=["POST"]),
        ]

    async def aclose(self) -> None:
        """Shutdown: every call hung up and freed."""
        await self.registry.close_all(HANG_UP_WAIT_S)

    async def create(self, request: Request, trace_id: str) -> Response:
        runtime = self.runtime
        peer_mod = peer_module()
        token = bearer_token(request.headers.get("authorization"))
        if not is_client_secret(token, self.keys):
            self.keys.authenticate(token)  # a wrong key is told before the body is read
        limits = runtime.settings.limits
        offer, session = await read_offer(request, MAX_BODY, limits.max_json_depth)
        peer_mod.check_offer(offer)
        # A client secret is used up here (after the checks above, which cost it nothing);
        # the session object it carries applies first.
        key_id, secret_session = realtime_principal(self.keys, secrets_of(runtime), token)
        principal = key_id or ANONYMOUS
        try:
            admit(runtime, stream=True)
        except VoxError as exc:
            count_refusal(runtime, exc, WEBRTC.name)
            raise
        installed = installed_of(
            runtime.engines, runtime.settings.vad, runtime.settings.tts.openai_voices
        )
        wire = call_wire(installed, secret_session, session)
        config = wire.config()
        try:
            driver = await SessionDriver.open_with_model(  # the session's transcription model
                runtime, config, wire=WEBRTC, principal=principal, owner=principal
            )
        except VoxError as exc:
            count_refusal(runtime, exc, WEBRTC.name)
            raise
        peer: Peer = peer_mod.Peer(runtime.settings.webrtc, self.ports)
        # The reply track's frame lateness as a metric (i22-bench adds the histogram).
        peer.outbound.lag.sink = getattr(runtime.metrics, "observe_frame_lag", None)
        try:
            answer = await peer.answer(offer)
        except BaseException as exc:
            await peer.close()
            driver.close()
            if isinstance(exc, VoxError) and exc.code is ErrorCode.OVERLOADED:
                count_refusal(runtime, exc, WEBRTC.name)
            raise
        driver.start()
        call = Call(self, driver, wire, peer)
        if is_client_secret(token, self.keys):
            call.secret_digest = digest(token)  # the page hangs up with the secret it used
        self.registry.add(call)
        call.task = asyncio.get_running_loop().create_task(call.run(), name=f"{WEBRTC.tasks}-call")
        headers = {"Location": f"/v1/realtime/calls/{call.call_id}"}
        return Response(answer, status_code=201, media_type=SDP_TYPE, headers=headers)

    def _hanging_up(self, request: Request) -> LiveCall:
        """The call a hang-up names, if the caller may end it: the key that made it (or
        minted the client secret it was made with), or that very secret (spent, but a page
        ends its call with the bearer it made it with). `call_not_found` otherwise."""
        token = bearer_token(request.headers.get("authorization"))
        call_id = request.path_params["call_id"]
        if is_client_secret(token, self.keys):
            call = self.registry.get(call_id)
            made_with = call.secret_digest
            if made_with is None or not hmac.compare_digest(made_with, digest(token)):
                raise self.registry.not_found(call_id)
            return call
        return self.registry.find(call_id, self.keys.authenticate(token))

    async def _hang_up(self, request: Request) -> None:
        call = self._hanging_up(request)
        call.hang_up()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(HANG_UP_WAIT_S):
                await call.wait_ended()

    async def delete(self, request: Request, trace_id: str) -> Response:
        await self._hang_up(request)
        return Response(status_code=204)

    async def hangup(self, request: Request, trace_id: str) -> Response:
        await self._hang_up(request)
        return Response(status_code=200)

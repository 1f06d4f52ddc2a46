"""One streaming gRPC call (Converse or Recognize) = one Session, driven like the WebSocket.

Same admission (readiness, `limits.max_sessions`), handshake (the first request is the
config, within 10 s), tasks and error rules as the WebSocket, by the same driver
(session/driver.py): its receiver reads the request stream (`GrpcInput`), and the call's
response generator is the sender draining the outbox. Differences that come from gRPC
itself:

- Half-closing the request stream is `audio.end` (no more input), not a disconnect; a
  client that cancels the call (or disconnects) cancels the handler and so every task.
- After an in-band `end`, the call reads on until the client half-closes (or sends nothing
  for a second) before `ended`: what it still sends is refused and counted there, and its
  writes never race the status (grpc's client reports such a race as INTERNAL).
- A fatal error ends the call with a status (codec.status_for) after a final `ended`
  message when a session existed; non-fatal ones are `error` messages in the stream.
  Between `ended` and the status the call reads on, as after `end`, until the client
  half-closes or sends nothing for a second (at most `FATAL_LINGER_S` in all): a client
  still writing audio when its session failed would otherwise see INTERNAL, not the status.
- Audio messages may carry several 20 ms frames; each frame is fed with its own seq_id.
- Idle and lifetime limits as on the WebSocket (`limits.idle_timeout_s` while input is
  open, `limits.max_session_s` always): `ended`, then DEADLINE_EXCEEDED with the code.
- Per-key quotas: the session slot at open (RESOURCE_EXHAUSTED `quota_exceeded`), the
  key's audio minute per audio message (over it: the message's frames are counted in
  `rejected`, one in-stream `error` per run of refusals, the session goes on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, NoReturn, TypeVar

import grpc

from voxserve.errors import ErrorCode, VoxError
from voxserve.events import ClientMessage, StreamConfig, TtsStart
from voxserve.pipeline.outbox import Outgoing
from voxserve.runtime import Runtime
from voxserve.server.grpc import codec
from voxserve.server.grpc import events as grpc_events
from voxserve.server.session.admission import admit
from voxserve.server.session.attachment import attach
from voxserve.server.session.auth import ANONYMOUS
from voxserve.server.session.driver import SessionDriver
from voxserve.server.session.input import BadAudio, ClientInput, Decoded, InputEnd, Wire
from voxserve.server.session.slot import count_refusal
from voxserve.v1 import voxserve_pb2 as pb

log = logging.getLogger(__name__)

# linger_s: after `end`, `ended` and the status wait for the half-close, or a second with no
# request (a client that waits for `ended` before it half-closes).
GRPC = Wire("grpc", in_band_end=False, stalls=False, tasks="voxserve-grpc", linger_s=1.0)
# After a fatal `ended`, the most the status waits for a client that keeps writing.
FATAL_LINGER_S = 3.0
TRANSPORT = GRPC.name

Req = TypeVar("Req", pb.ConverseRequest, pb.RecognizeRequest)
Resp = TypeVar("Resp", pb.ConverseResponse, pb.RecognizeResponse)
Input = ClientMessage | pb.AudioFrames


async def abort(
    context: grpc.aio.ServicerContext[Any, Any], error: VoxError, trace_id: str | None = None
) -> NoReturn:
    """End the call with the status for `error` and the voxserve code in trailing metadata."""
    await context.abort(
        codec.status_for(error.code),
        codec.details(error),
        trailing_metadata=codec.trailing_metadata(error, trace_id),
    )
    raise AssertionError("context.abort returned")  # it always raises


class GrpcInput(Generic[Req]):
    """A call's request stream as the driver's way in (session_input.ClientInput)."""

    def __init__(
        self,
        requests: AsyncIterator[Req | codec.Undecodable],
        parse: Callable[[Req | codec.Undecodable], Input],
        sample_rate: int,
        max_frame_ms: int,
    ) -> None:
        self._requests: AsyncIterator[Req | codec.Undecodable] = requests
        self._parse: Callable[[Req | codec.Undecodable], Input] = parse
        self._rate = sample_rate
        self._max_frame_ms = max_frame_ms

    async def receive(self) -> Req | codec.Undecodable | InputEnd:
        try:
            return await anext(self._requests)
        except StopAsyncIteration:
            return InputEnd.CLOSED  # the client half-closed: no more input
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            return InputEnd.GONE  # the call is over; the handler is being cancelled

    def decode(self, request: Req | codec.Undecodable) -> Decoded:
        item = self._parse(request)
        if not isinstance(item, pb.AudioFrames):
            return item
        try:
            return codec.split_frames(item, self._rate, self._max_frame_ms)
        except VoxError as exc:
            raise BadAudio(exc) from None

    def release(self) -> None:
        """Nothing is held back: every request is handed to the session as it comes."""


class SessionCall(Generic[Req, Resp]):
    """One call; `parse_first` turns the first request into a StreamConfig (or raises),
    `parse` turns later ones into input, `response_type` is what goes out."""

    def __init__(
        self,
        runtime: Runtime,
        context: grpc.aio.ServicerContext[Any, Any],
        *,
        parse_first: Callable[[Req | codec.Undecodable], StreamConfig],
        parse: Callable[[Req | codec.Undecodable], Input],
        response_type: type[Resp],
        principal: str = ANONYMOUS,
    ) -> None:
        self.runtime = runtime
        self.principal = principal
        self.opened_at = time.monotonic()
        self.context = context
        self.parse_first: Callable[[Req | codec.Undecodable], StreamConfig] = parse_first
        self.parse: Callable[[Req | codec.Undecodable], Input] = parse
        self.response_type: type[Resp] = response_type
        self.limits = runtime.settings.limits
        self._reply = 0  # the reply the audio now being sent belongs to

    async def responses(
        self, requests: AsyncIterator[Req | codec.Undecodable]
    ) -> AsyncIterator[Resp]:
        """The call's response stream (the servicer method yields from this)."""
        try:
            driver = await self._open(requests)
        except VoxError as exc:
            count_refusal(self.runtime, exc, TRANSPORT)
            await abort(self.context, exc)
        driver.start()
        try:
            async for response in self._run(driver, requests):
                yield response
        finally:
            driver.close()
            await driver.wait_closed()

    async def _open(self, requests: AsyncIterator[Req | codec.Undecodable]) -> SessionDriver:
        timeout_s = self.limits.handshake_timeout_s
        try:
            first = await asyncio.wait_for(anext(requests), timeout_s)
        except TimeoutError:
            raise VoxError(
                ErrorCode.NOT_STARTED, f"no config within {timeout_s:g} s", fatal=True
            ) from None
        except StopAsyncIteration:
            raise VoxError(
                ErrorCode.NOT_STARTED, "the request stream ended before a config", fatal=True
            ) from None
        # Admission after the first request: refusing while the client is still writing
        # it makes grpc's client report INTERNAL instead of the status we send.
        admit(self.runtime, stream=True)
        return SessionDriver.open(
            self.runtime, lambda: self.parse_first(first), wire=GRPC, principal=self.principal
        )

    async def _run(
        self, driver: SessionDriver, requests: AsyncIterator[Req | codec.Undecodable]
    ) -> AsyncIterator[Resp]:
        session = driver.session
        driver.announce()
        started = grpc_events.encode_event(session.started_event(), self.response_type)
        assert started is not None
        yield started
        rate, max_frame_ms = session.config.sample_rate, self.limits.max_frame_ms
        source: ClientInput[Req | codec.Undecodable] = GrpcInput(
            requests, self.parse, rate, max_frame_ms
        )
        async with attach(driver, source, since=self.opened_at) as attachment:
            while (item := await session.outbox.next()) is not None:
                response = self._encode(item)
                if response is not None:
                    yield response
            await driver.stop()
            if driver.fatal is not None:  # the output ended: session.ended, then the status
                ended = grpc_events.encode_event(session.ended_event(), self.response_type)
                if ended is not None:
                    yield ended
                # The receiver reads on (and drops: the session is closing) until the
                # client half-closes or goes quiet, so no write of its races the status.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(FATAL_LINGER_S):
                        await attachment.input_over(GRPC.linger_s)
        if driver.fatal is not None:
            await abort(self.context, driver.fatal, session.trace_id)

    def _encode(self, item: Outgoing) -> Resp | None:
        if isinstance(item, bytes):
            if self.response_type is not pb.ConverseResponse:
                return None
            return grpc_events.encode_audio(item, self._reply)  # type: ignore[return-value]
        if isinstance(item, TtsStart):
            self._reply = item.reply
        return grpc_events.encode_event(item, self.response_type)


def converse_first(request: pb.ConverseRequest | codec.Undecodable) -> StreamConfig:
    request = codec.decoded(request, fatal=True)
    if request.WhichOneof("request") != "config":
        raise VoxError(ErrorCode.NOT_STARTED, "the first request must be a config", fatal=True)
    return codec.stream_config(request.config)


def recognize_first(request: pb.RecognizeRequest | codec.Undecodable) -> StreamConfig:
    request = codec.decoded(request, fatal=True)
    if request.WhichOneof("request") != "config":
        raise VoxError(ErrorCode.NOT_STARTED, "the first request must be a config", fatal=True)
    return codec.recognition_config(request.config)


def recognize_input(request: pb.RecognizeRequest | codec.Undecodable) -> Input:
    request = codec.decoded(request)
    kind = request.WhichOneof("request")
    if kind == "audio":
        return request.audio
    if kind == "config":
        raise VoxError(ErrorCode.ALREADY_STARTED, "the session has already started")
    raise VoxError(ErrorCode.INVALID_MESSAGE, "request has none of its fields set")

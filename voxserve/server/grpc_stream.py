"""One streaming gRPC call (Converse or Recognize) = one Session, driven like the WebSocket.

Same admission (readiness, `limits.max_sessions`), handshake (the first request is the
config, within 10 s), tasks and error rules as ws_stream.py: a receiver task feeds the
session, the session's pipeline runs in its own task, and the call's response generator is
the sender draining the outbox. Differences that come from gRPC itself:

- Half-closing the request stream is `audio.end` (no more input), not a disconnect; a
  client that cancels the call (or disconnects) cancels the handler and so every task.
- A fatal error ends the call with a status (codec.status_for) after a final `ended`
  message when a session existed; non-fatal ones are `error` messages in the stream.
- Audio messages may carry several 20 ms frames; each frame is fed with its own seq_id.
- Idle and lifetime limits as on the WebSocket (`limits.idle_timeout_s` while input is
  open, `limits.max_session_s` always): `ended`, then DEADLINE_EXCEEDED with the code.
- Per-key quotas: the session slot at open (RESOURCE_EXHAUSTED `quota_exceeded`), the
  key's audio minute per audio message (over it: the message's frames are counted in
  `rejected`, one in-stream `error` per run of refusals, the session goes on).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, NoReturn, TypeVar

import grpc

from voxserve.errors import ErrorCode, VoxError
from voxserve.events import (
    CancelMessage,
    ClientMessage,
    EndMessage,
    MarkMessage,
    StartMessage,
    StreamConfig,
    TextMessage,
    TtsStart,
)
from voxserve.observe.logs import bind_session
from voxserve.pipeline.drain import SessionDrain
from voxserve.pipeline.outbox import Outbox, Outgoing
from voxserve.pipeline.session import Session
from voxserve.runtime import Runtime
from voxserve.server import grpc_codec as codec
from voxserve.server import grpc_events
from voxserve.server.admission import admit
from voxserve.server.auth import ANONYMOUS, cache_scope
from voxserve.server.quotas import SessionQuota, quotas_of
from voxserve.v1 import voxserve_pb2 as pb

log = logging.getLogger(__name__)

TRANSPORT = "grpc"

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


class SessionCall(Generic[Req, Resp]):
    """The driver of one call; `parse_first` turns the first request into a StreamConfig
    (or raises), `parse` turns later ones into input, `response_type` is what goes out."""

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
        self.quota: SessionQuota | None = None
        self._last_message_at = time.monotonic()
        self._input_open = True
        self.context = context
        self.parse_first: Callable[[Req | codec.Undecodable], StreamConfig] = parse_first
        self.parse: Callable[[Req | codec.Undecodable], Input] = parse
        self.response_type: type[Resp] = response_type
        self.limits = runtime.settings.limits
        self._fatal: VoxError | None = None
        self._reply = 0  # the reply the audio now being sent belongs to

    async def responses(
        self, requests: AsyncIterator[Req | codec.Undecodable]
    ) -> AsyncIterator[Resp]:
        """The call's response stream (the servicer method yields from this)."""
        metrics = self.runtime.metrics
        try:
            session = await self._open(requests)
        except VoxError as exc:
            metrics.errors.labels(exc.code.value, TRANSPORT).inc()
            metrics.refused.labels(exc.code.value).inc()
            self._release_quota()
            await abort(self.context, exc)
        mode = session.config.mode
        metrics.sessions_total.labels(mode).inc()
        active = metrics.sessions_active.labels(mode)
        active.inc()
        self.runtime.active_sessions += 1
        try:
            async for response in self._run(session, requests):
                yield response
        finally:
            self._release_quota()
            self.runtime.active_sessions -= 1
            active.dec()
            metrics.session_counts(session.ended_event())

    async def _open(self, requests: AsyncIterator[Req | codec.Undecodable]) -> Session:
        timeout_s = self.runtime.settings.limits.handshake_timeout_s
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
        admit(self.runtime)
        self.quota = quotas_of(self.runtime).open_session(self.principal)
        config = self.parse_first(first)
        outbox = Outbox(self.runtime.settings.pipeline.outbox_messages)
        try:
            scope = cache_scope(self.runtime.settings, self.principal)
            return Session(self.runtime.session_context(), config, outbox, cache_scope=scope)
        except VoxError as exc:
            exc.fatal = True
            raise

    async def _run(
        self, session: Session, requests: AsyncIterator[Req | codec.Undecodable]
    ) -> AsyncIterator[Resp]:
        # Log lines of this call's tasks (created below, so they copy this context) carry
        # the trace and session ids; never audio or text.
        bind_session(session.trace_id, session.id)
        log.info("session started", extra={"mode": session.config.mode, "transport": TRANSPORT})
        started = grpc_events.encode_event(session.started_event(), self.response_type)
        assert started is not None
        yield started
        pipeline = asyncio.create_task(self._pipeline(session), name="voxserve-grpc-session")
        receiver = asyncio.create_task(
            self._receive(session, requests), name="voxserve-grpc-receiver"
        )
        limits = asyncio.create_task(self._watch_limits(session), name="voxserve-grpc-limits")
        drainable = SessionDrain(session, pipeline)  # SIGTERM: finish, then server_shutdown
        self.runtime.drain.add(drainable)
        try:
            while (item := await session.outbox.next()) is not None:
                response = self._encode(item)
                if response is not None:
                    yield response
        finally:
            self.runtime.drain.discard(drainable)
            for task in (pipeline, receiver, limits):
                task.cancel()
            results = await asyncio.gather(pipeline, receiver, limits, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(
                    result, asyncio.CancelledError
                ):
                    log.error("session task failed", exc_info=result)
            log.info("session closed", extra={"transport": TRANSPORT})
        if self._fatal is not None:
            ended = grpc_events.encode_event(session.ended_event(), self.response_type)
            if ended is not None:
                yield ended
            self.runtime.metrics.errors.labels(self._fatal.code.value, TRANSPORT).inc()
            await abort(self.context, self._fatal, session.trace_id)

    def _encode(self, item: Outgoing) -> Resp | None:
        if isinstance(item, bytes):
            if self.response_type is not pb.ConverseResponse:
                return None
            return grpc_events.encode_audio(item, self._reply)  # type: ignore[return-value]
        if isinstance(item, TtsStart):
            self._reply = item.reply
        return grpc_events.encode_event(item, self.response_type)

    async def _pipeline(self, session: Session) -> None:
        try:
            await session.run()
        except VoxError as exc:
            exc.fatal = True
            await self._end_fatally(session, exc)
        except Exception:
            log.exception("session pipeline failed")
            await self._end_fatally(
                session, VoxError(ErrorCode.INTERNAL, "internal error; see server logs", fatal=True)
            )

    def _release_quota(self) -> None:
        if self.quota is not None:
            self.quota.release()

    async def _watch_limits(self, session: Session) -> None:
        """The WebSocket's rule: idle while input is open, lifetime always. A task of its
        own, so the receive path pays one clock read per message."""
        idle = self.limits.idle_timeout_s
        expires_at = time.monotonic() + self.limits.max_session_s
        while self._fatal is None:
            now = time.monotonic()
            if now >= expires_at:
                limit = self.limits.max_session_s
                error = VoxError(
                    ErrorCode.SESSION_EXPIRED, f"sessions last at most {limit:g} s", fatal=True
                )
                await self._end_fatally(session, error)
                return
            wake_at = expires_at
            if self._input_open:
                if now - self._last_message_at >= idle:
                    error = VoxError(
                        ErrorCode.IDLE_TIMEOUT,
                        f"no message from the client for {idle:g} s",
                        fatal=True,
                    )
                    await self._end_fatally(session, error)
                    return
                wake_at = min(wake_at, self._last_message_at + idle)
            await asyncio.sleep(wake_at - now + 0.001)

    async def _audio_quota(self, session: Session, frames: int, seconds: float) -> bool:
        """Charge the key's audio minute; a refused message's frames count in `rejected`."""
        if self.quota is None:
            return True
        verdict = self.quota.audio(seconds)
        if verdict.accepted:
            return True
        session.rejected += frames
        if verdict.report is not None:
            self.runtime.metrics.errors.labels(verdict.report.code.value, TRANSPORT).inc()
            await session.outbox.event(verdict.report.to_event())
        return False

    async def _end_fatally(self, session: Session, error: VoxError) -> None:
        """Stop sending: the call ends with `error`'s status after what is queued."""
        if self._fatal is None:
            self._fatal = error
        await session.outbox.close()

    async def _receive(
        self, session: Session, requests: AsyncIterator[Req | codec.Undecodable]
    ) -> None:
        """Feed the session until the client half-closes (= end of input). An error in one
        message is reported in the stream and the session goes on."""
        rate = session.config.sample_rate
        max_frame_ms = self.limits.max_frame_ms
        metrics = self.runtime.metrics
        try:
            async for request in requests:
                self._last_message_at = time.monotonic()  # read by _watch_limits
                try:
                    item = self.parse(request)
                    if isinstance(item, pb.AudioFrames):
                        try:
                            frames = codec.split_frames(item, rate, max_frame_ms)
                        except VoxError:
                            session.rejected += 1
                            raise
                        seconds = len(item.pcm) / (2 * rate)
                        if not await self._audio_quota(session, len(frames), seconds):
                            continue
                        await _feed_frames(session, frames)
                    else:
                        await self._control(session, item)
                except VoxError as exc:
                    metrics.errors.labels(exc.code.value, TRANSPORT).inc()
                    if exc.fatal:
                        await self._end_fatally(session, exc)
                        return
                    await session.outbox.event(exc.to_event())
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            return  # the call is over; the handler is being cancelled
        self._input_open = False
        await session.end_input()

    async def _control(self, session: Session, message: ClientMessage) -> None:
        if isinstance(message, TextMessage):
            await session.feed_text(message.text, flush=message.flush)
        elif isinstance(message, EndMessage):
            await session.end_input()
        elif isinstance(message, CancelMessage):
            await session.cancel()
        elif isinstance(message, MarkMessage):
            await session.mark(message.id)
        elif isinstance(message, StartMessage):
            raise VoxError(ErrorCode.ALREADY_STARTED, "the session has already started")


async def _feed_frames(session: Session, frames: list[tuple[int, memoryview]]) -> None:
    """Each frame of a message as if it had come alone (so each refused one is counted);
    one error for the message, the first."""
    refused: VoxError | None = None
    for seq, pcm in frames:
        try:
            await session.feed_audio(seq, pcm)
        except VoxError as exc:
            refused = refused or exc
    if refused is not None:
        raise refused


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

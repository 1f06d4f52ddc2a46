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
from collections.abc import Callable
from functools import partial
from typing import Any

from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from voxserve.errors import ErrorCode, VoxError
from voxserve.events import (
    CancelMessage,
    CreditMessage,
    EndMessage,
    MarkMessage,
    ResumeMessage,
    SessionResumed,
    StartMessage,
    TextMessage,
    event_type,
)
from voxserve.observe.logs import bind_session
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.session import Session
from voxserve.runtime import Runtime
from voxserve.server.admission import admit
from voxserve.server.auth import (
    ANONYMOUS,
    SUBPROTOCOL,
    KeyRing,
    bearer_token,
    cache_scope,
    check_origin,
    subprotocol_token,
)
from voxserve.server.quotas import SessionQuota, quotas_of
from voxserve.server.ws_fastpath import FastPath, fast_path_of
from voxserve.server.ws_live import LiveStream, ParkedStreams
from voxserve.server.ws_protocol import (
    encode_event,
    max_frame_bytes,
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
    parked = ParkedStreams()  # sessions whose client dropped, waiting for session.resume

    async def endpoint(websocket: WebSocket) -> None:
        await StreamConnection(runtime, websocket, keys, parked).serve()

    return [WebSocketRoute("/v1/stream", endpoint)]


class StreamConnection:
    def __init__(
        self, runtime: Runtime, websocket: WebSocket, keys: KeyRing, parked: ParkedStreams
    ) -> None:
        self.runtime = runtime
        self.ws = websocket
        self.limits = runtime.settings.limits
        self.parked = parked
        self._last_message_at = time.monotonic()
        self._client_left = False  # the socket closed under us (not a session.end)
        self.keys = keys
        self.key_id: str | None = None
        self.quota: SessionQuota | None = None  # this session's hold on its key's quotas
        self.fast: FastPath | None = fast_path_of(websocket.scope)

    async def serve(self) -> None:
        # Accepted before any check, so a refused client reads why (an error event and a
        # close code) instead of a bare HTTP 403. `voxserve.v1` is selected when offered:
        # never the bearer subprotocol, whose name carries the key.
        offered = self.ws.scope.get("subprotocols") or []
        await self.ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        try:
            live, resumed = await self._open_session()
        except VoxError as exc:
            metrics = self.runtime.metrics
            metrics.errors.labels(exc.code.value, "ws").inc()
            metrics.refused.labels(exc.code.value).inc()
            await self._fail(exc)
            return
        except WebSocketDisconnect:
            return
        if not resumed:
            live.start()
        try:
            await self._run(live, resumed=resumed)
        finally:
            window = self.limits.resume_window_s
            if (
                self._client_left
                and not live.session.outbox.stalled  # a stalled reader is ended, not kept
                and window > 0
                and live.session.config.resumable
                and not live.finished
                and not live.closing
            ):
                live.park(window)
            else:
                live.close()
                await live.wait_closed()

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

    def _release_quota(self) -> None:
        if self.quota is not None:
            self.quota.release()
            self.quota = None

    async def _open_session(self) -> tuple[LiveStream, bool]:
        """Authenticate and admit (the global rule), read the first message, then either
        hand back the parked session it resumes or open a new one (the key's quotas)."""
        self._authenticate()
        # Refused before the first message is read, so a refused client learns it at once.
        admit(self.runtime, parked=len(self.parked))
        first = await self._first_message()
        if isinstance(first, ResumeMessage):
            return self.parked.take(first.session_id, self.key_id), True
        # Per-key quotas after the global rule: refused at open, before any audio.
        self.quota = quotas_of(self.runtime).open_session(self.key_id or ANONYMOUS)
        try:
            outbox = Outbox(
                self.runtime.settings.pipeline.outbox_messages, self.limits.stalled_client_s
            )
            try:
                scope = cache_scope(self.runtime.settings, self.key_id or ANONYMOUS)
                session = Session(
                    self.runtime.session_context(), first.config, outbox, cache_scope=scope
                )
            except VoxError as exc:
                exc.fatal = True
                raise
        except BaseException:
            self._release_quota()
            raise
        quota, self.quota = self.quota, None  # the stream holds it from now on
        live = LiveStream(
            self.runtime, session, key_id=self.key_id, quota=quota, parked=self.parked
        )
        return live, False

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

    def _parse_fatal(self, text: str) -> Any:
        try:
            return parse_text_message(
                text, self.limits.max_message_bytes, self.limits.max_json_depth
            )
        except VoxError as exc:
            exc.fatal = True
            raise

    async def _run(self, live: LiveStream, *, resumed: bool) -> None:
        session = live.session
        # Every log line of this connection's tasks (created below, so they copy this
        # context) carries the trace and session ids; never the audio or the text.
        bind_session(session.trace_id, session.id)
        if resumed:
            await self.ws.send_text(encode_event(self._resumed_event(session)))
            log.info("session resumed", extra={"mode": session.config.mode})
        else:
            await self.ws.send_text(encode_event(session.started_event()))
            log.info("session started", extra={"mode": session.config.mode})
        fast = self.fast
        release = partial(self._release_input, session)
        if fast is not None:
            fast.sink = self._audio_sink(live)
            session.release_input = release
        sender = asyncio.create_task(self._send(live), name="voxserve-sender")
        receiver = asyncio.create_task(self._receive(live), name="voxserve-receiver")
        limits = asyncio.create_task(self._watch_limits(live), name="voxserve-limits")
        tasks = {sender, receiver, limits}
        if fast is not None:  # the protocol watches that the client reads (ws_stall.py)
            fast.stall_s = self.limits.stalled_client_s
            fast.on_stall = partial(self._on_stall, live, sender)
        try:
            await self._wait_end(live, sender, receiver)
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            if fast is not None:
                fast.on_stall = fast.stall_s = None
                self._release_input(session)  # held audio is counted below, either way
                if session.release_input is release:  # a resumed connection has its own
                    session.release_input = None
                fast.sink, fast.open = None, False
                counted = self.runtime.metrics.ws_audio_messages
                counted.labels("direct").inc(fast.direct)
                counted.labels("queued").inc(fast.queued)
                self.runtime.metrics.ws_frames_split.inc(fast.split)
                self.runtime.metrics.ws_events_direct.inc(fast.sent_direct)
                fast.direct = fast.queued = fast.split = fast.sent_direct = 0
        for result in results:
            if isinstance(result, BaseException) and not isinstance(
                result, asyncio.CancelledError | WebSocketDisconnect
            ):
                log.error("session task failed", exc_info=result)
        if session.outbox.stalled:
            await self._close_stalled(live)
        log.info("session closed")

    def _resumed_event(self, session: Session) -> SessionResumed:
        """What a reconnecting client needs: send audio after `acked_seq` again."""
        return SessionResumed(
            session_id=session.id,
            trace_id=session.trace_id,
            acked_seq=session.acked_seq,
            credit_window=session.credit.size if session.credit else None,
        )

    async def _send(self, live: LiveStream) -> None:
        """Drain the outbox into the socket; ends the connection when the session is over.
        An item taken but not written when the socket fails is kept for a resume."""
        outbox = live.session.outbox
        fast = self.fast
        while True:
            item = live.unsent
            if item is None:
                item = await outbox.next()
                if item is None:
                    break
                live.unsent = item
            try:
                message = item if isinstance(item, bytes) else encode_event(item)
            except (TypeError, ValueError):
                await self._unsendable(live, event_type(item))  # type: ignore[arg-type]
                return
            try:
                if isinstance(message, bytes):
                    await self.ws.send_bytes(message)
                elif fast is not None and fast.send_text is not None and fast.send_text(message):
                    fast.sent_direct += 1
                else:
                    await self.ws.send_text(message)
            except (RuntimeError, OSError, WebSocketDisconnect):
                self._client_left = True
                return
            live.unsent = None
        code = CLOSE_INTERNAL if live.session.end_reason == ErrorCode.INTERNAL else CLOSE_NORMAL
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await self.ws.close(code)

    async def _unsendable(self, live: LiveStream, event_type: str) -> None:
        """An event that cannot be encoded (a bug: client text is checked on the way in)
        ends the session the documented way: `internal`, `session.ended`, close 1011; the
        client is never left with a dropped connection (1006) and no goodbye."""
        session = live.session
        log.error("event could not be encoded; session ended", extra={"event": event_type})
        self._release_input(session)  # audio received before the end is counted in it
        live.closing = True
        live.unsent = None
        session.end_reason = ErrorCode.INTERNAL.value
        self.runtime.metrics.errors.labels(ErrorCode.INTERNAL.value, "ws").inc()
        error = VoxError(ErrorCode.INTERNAL, "internal error; see server logs", fatal=True)
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
            await self.ws.send_text(encode_event(error.to_event(trace_id=session.trace_id)))
            await self.ws.send_text(encode_event(session.ended_event()))
            await self.ws.close(CLOSE_INTERNAL)

    @staticmethod
    async def _wait_end(
        live: LiveStream, sender: asyncio.Task[None], receiver: asyncio.Task[None]
    ) -> None:
        """Until the sender (session over) or the receiver (client gone) ends, or the
        pipeline ends because the client stalled (it reads nothing, so the sender never
        would). A pipeline that ends otherwise leaves the goodbye to the sender."""
        ends: set[asyncio.Task[None]] = {sender, receiver}
        pipeline = live.pipeline
        if pipeline is not None and not pipeline.done():
            done, _ = await asyncio.wait(ends | {pipeline}, return_when=asyncio.FIRST_COMPLETED)
            if done & ends or live.session.outbox.stalled:
                return
        await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)

    @staticmethod
    def _on_stall(live: LiveStream, sender: asyncio.Task[None]) -> None:
        """The protocol saw the client read nothing for `stalled_client_s` while output
        waited: the session ends as stalled (the sender, stuck on the socket, stops)."""
        live.session.outbox.stalled = True
        sender.cancel()

    async def _close_stalled(self, live: LiveStream) -> None:
        """A client that reads nothing cannot be told in-band: close with 1008 and the
        code as the reason (counted as the error). The protocol closes without waiting for
        its buffer to drain (it never would); elsewhere the ASGI close gets a second."""
        live.session.end_reason = ErrorCode.CLIENT_STALLED.value
        self.runtime.metrics.errors.labels(ErrorCode.CLIENT_STALLED.value, "ws").inc()
        fast = self.fast
        if fast is not None and fast.close_stalled is not None:
            fast.close_stalled()
            return
        with contextlib.suppress(RuntimeError, WebSocketDisconnect, TimeoutError, OSError):
            async with asyncio.timeout(1.0):
                await self.ws.close(CLOSE_POLICY, reason=ErrorCode.CLIENT_STALLED.value)

    async def _receive(self, live: LiveStream) -> None:
        """Read client messages until it disconnects; errors in one message are reported and
        the session goes on, fatal ones end it."""
        session = live.session
        max_frame_ms = self.limits.max_frame_ms
        rate = session.config.sample_rate
        fast = self.fast or FastPath()  # no fast path: a switch nobody reads
        while True:
            fast.open = True  # frames may go straight to the session while we wait
            try:
                message = await self.ws.receive()
            finally:
                fast.open = False
            self._last_message_at = time.monotonic()  # read by _watch_limits
            if message["type"] == "websocket.disconnect":
                self._client_left = True
                return
            if live.closing:
                continue  # a fatal error was sent; the sender closes the socket after it
            data = message.get("bytes")
            try:
                if data is not None:
                    try:
                        seq, pcm = parse_audio_frame(data, rate, max_frame_ms)
                    except VoxError:
                        session.rejected += 1
                        raise
                    if not await self._audio_quota(live, len(pcm) / (2 * rate)):
                        continue
                    await session.feed_audio(seq, pcm)
                    continue
                parsed = parse_text_message(
                    message.get("text") or "",
                    self.limits.max_message_bytes,
                    self.limits.max_json_depth,
                )
                if isinstance(parsed, TextMessage):
                    await session.feed_text(parsed.text, flush=parsed.flush)
                elif isinstance(parsed, EndMessage):
                    await session.end_input()
                elif isinstance(parsed, CancelMessage):
                    await session.cancel()
                elif isinstance(parsed, MarkMessage):
                    await session.mark(parsed.id)
                elif isinstance(parsed, CreditMessage):
                    session.speaker.grant(parsed.audio_ms)
                elif isinstance(parsed, StartMessage | ResumeMessage):
                    raise VoxError(ErrorCode.ALREADY_STARTED, "the session has already started")
            except VoxError as exc:
                self.runtime.metrics.errors.labels(exc.code.value, "ws").inc()
                await session.outbox.event(exc.to_event())
                if exc.fatal:
                    await self._end_fatally(live, None)

    def _release_input(self, session: Session) -> None:
        """Session.release_input: the fast path hands over what it holds, then holds back
        no more than the session now wants."""
        fast = self.fast
        if fast is not None:
            if fast.hand_over is not None:
                fast.hand_over()
            fast.hold_samples = session.audio_wanted_in()

    def _audio_sink(self, live: LiveStream) -> Callable[[list[bytes]], int]:
        """The fast path's sink (server/ws_fastpath.py): valid frames the session can take
        without waiting are taken here, inside the socket's `data_received`, several at a
        time; it returns how many it took from the first, and the rest go to `_receive`,
        which reports errors and waits for credit. It tells the protocol how much audio
        it may hold before the next hand-over: what the session can wait for."""
        session = live.session
        max_frame_ms = self.limits.max_frame_ms
        rate = session.config.sample_rate
        limit = max_frame_bytes(rate, max_frame_ms)
        charged = isinstance(live.quota, SessionQuota) and live.quota.charges_audio
        fast = self.fast

        def sink(messages: list[bytes]) -> int:
            if live.closing:
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
                self._take_audio(live, frames, charged)
                taken = len(frames)
            else:  # not all at once: as many as fit, one at a time
                taken = 0
                for frame in frames:
                    if not session.can_take_audio_now(frame[1].nbytes):
                        break
                    self._take_audio(live, [frame], charged)
                    taken += 1
            if fast is not None:
                fast.hold_samples = session.audio_wanted_in()
            return taken

        return sink

    def _take_audio(
        self, live: LiveStream, frames: list[tuple[int, memoryview]], charged: bool
    ) -> None:
        """Write frames the session has room for; a quota refuses frame by frame (counted
        in `rejected`; its one report per run of refusals is sent without waiting: an
        outbox full means a client not reading)."""
        self._last_message_at = now = time.monotonic()
        if charged:
            rate = live.session.config.sample_rate
            kept = []
            for seq, pcm in frames:
                accepted, report = self._charge_audio(live, len(pcm) / (2 * rate))
                if report is not None:
                    live.session.outbox.event_nowait(report.to_event())
                if accepted:
                    kept.append((seq, pcm))
            frames = kept
        live.session.take_audio_now(frames, now)

    async def _audio_quota(self, live: LiveStream, seconds: float) -> bool:
        """`_charge_audio`, its report sent (waiting for the outbox like any event)."""
        accepted, report = self._charge_audio(live, seconds)
        if report is not None:
            await live.session.outbox.event(report.to_event())
        return accepted

    def _charge_audio(self, live: LiveStream, seconds: float) -> tuple[bool, VoxError | None]:
        """Charge the key's audio minute (the stream holds the session's quota). Over it the
        message is refused (counted in `rejected`; one non-fatal `quota_exceeded` per run
        of refusals, returned to be sent) and the session goes on, so audio already
        accepted is still finished."""
        if not isinstance(live.quota, SessionQuota):
            return True, None
        verdict = live.quota.audio(seconds)
        if verdict.accepted:
            return True, None
        live.session.rejected += 1
        if verdict.report is not None:
            self.runtime.metrics.errors.labels(verdict.report.code.value, "ws").inc()
        return False, verdict.report

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

    async def _watch_limits(self, live: LiveStream) -> None:
        """End a session whose client went silent (`limits.idle_timeout_s`) or that has
        lasted `limits.max_session_s`. A task of its own, so the receive path pays one clock
        read per message, not a timer."""
        idle = self.limits.idle_timeout_s
        expires_at = live.session.started_at + self.limits.max_session_s
        while not live.closing:
            now = time.monotonic()
            if now >= expires_at:
                await self._end_fatally(live, self._limit_error(expired=True))
                return
            if now - self._last_message_at >= idle:
                await self._end_fatally(live, self._limit_error(expired=False))
                return
            await asyncio.sleep(min(expires_at, self._last_message_at + idle) - now + 0.001)

    async def _end_fatally(self, live: LiveStream, error: VoxError | None) -> None:
        """After a fatal error: report it (unless already sent), then the counters, then
        close; the sender closes the socket once these are out."""
        if live.closing:
            return
        session = live.session
        self._release_input(session)  # audio received before the end is counted in it
        live.closing = True
        if error is not None:
            session.end_reason = error.code.value
            self.runtime.metrics.errors.labels(error.code.value, "ws").inc()
            await session.outbox.event(error.to_event())
        await session.outbox.event(session.ended_event())
        await session.outbox.close()

    async def _fail(self, error: VoxError) -> None:
        """Refuse a connection that never became a session, with a code for the transport."""
        try_again = (
            ErrorCode.OVERLOADED,
            ErrorCode.NOT_READY,
            ErrorCode.QUOTA_EXCEEDED,
            ErrorCode.SHUTTING_DOWN,
        )
        code = CLOSE_TRY_AGAIN if error.code in try_again else CLOSE_POLICY
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            event = error.to_event(retry_after_ms=1000 if code == CLOSE_TRY_AGAIN else None)
            await self.ws.send_text(encode_event(event))
            await self.ws.close(code, reason=error.code.value)

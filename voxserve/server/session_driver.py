"""One session from `session.started` to `session.ended`, whatever the transport.

The driver owns what every transport used to write again: the session's pipeline task,
the receiver and limits-watcher tasks of the connection attached to it, the key's quota
(one charge for audio, however it arrives), the fatal end, the session counts, the log
context, the drain, and the teardown that cancels, awaits and reports its tasks. A
transport opens it (`open`), `start`s it, and attaches its connection's way in
(session_input.ClientInput) with `attached` (a pulled response stream: gRPC) or `serve`
(a sender task: the WebSocket); it keeps its codec and how it writes and closes.

Wires differ in one thing only (`Wire.in_band_end`): a fatal error is either an event
followed by `session.ended` on the stream (the WebSocket), or the call's status after
`session.ended` (gRPC, which reads `fatal` once the outbox is drained).

A session may outlive its connection (`park`, `resume`: session_parking.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from voxserve.config import LimitsConfig
from voxserve.errors import ErrorCode, VoxError
from voxserve.observe.logs import bind_session
from voxserve.pipeline.outbox import Event, Outgoing
from voxserve.pipeline.session import Session
from voxserve.pipeline.stream_config import StreamConfig
from voxserve.runtime import Runtime
from voxserve.server.quotas import AudioVerdict
from voxserve.server.session_events import error_event, internal_error, limit_error
from voxserve.server.session_input import (
    BadAudio,
    ClientInput,
    Frames,
    InputEnd,
    apply_control,
    feed_frames,
)
from voxserve.server.session_parking import ParkedSessions
from voxserve.server.session_slot import SessionSlot, new_session

log = logging.getLogger(__name__)

M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class Wire:
    """What the driver needs to know of a transport."""

    name: str  # the `transport` label of metrics.errors: "ws", "grpc"
    in_band_end: bool  # a fatal error is an event before session.ended (module docstring)
    stalls: bool  # output waits at most limits.stalled_client_s for the client to read
    tasks: str  # the prefix of its tasks' names


class SessionDriver:
    def __init__(
        self,
        runtime: Runtime,
        session: Session,
        slot: SessionSlot,
        *,
        wire: Wire,
        owner: str | None = None,
    ) -> None:
        """`owner`: the key id that may resume it."""
        self.runtime = runtime
        self.session = session
        self.slot = slot
        self.wire = wire
        self.owner = owner
        self.pipeline: asyncio.Task[None] | None = None
        self.closing = False  # a fatal end began: input is ignored from now on
        self.fatal: VoxError | None = None  # a status wire's fatal error (in_band_end False)
        self.input_open = True  # the idle limit applies while the client may still send
        self.last_message_at = time.monotonic()  # read by the limits watcher
        self.unsent: Outgoing | None = None  # taken from the outbox, not written (resent)
        self.charges_audio = slot.quota.charges_audio  # fixed for the session's life
        self._input: ClientInput[Any] | None = None  # the attached connection's way in
        self._sender: asyncio.Task[None] | None = None
        self._ran = False  # the pipeline task began (it releases the session then)
        self._forced = False
        self._drain_task: asyncio.Task[None] | None = None
        self._parked: ParkedSessions | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._closed = False
        session.release_input = self.release_input

    @classmethod
    def open(
        cls,
        runtime: Runtime,
        config: Callable[[], StreamConfig],
        *,
        wire: Wire,
        principal: str,
        owner: str | None = None,
    ) -> SessionDriver:
        """The key's session slot (refused at once over quota), then the session for
        `config()` (read after the slot is taken); raises fatal VoxErrors."""
        slot = SessionSlot(runtime, principal)
        try:
            stall_s = runtime.settings.limits.stalled_client_s if wire.stalls else None
            session = new_session(runtime, config(), principal, stall_s=stall_s)
        except BaseException:
            slot.release()
            raise
        return cls(runtime, session, slot, wire=wire, owner=owner)

    @property
    def id(self) -> str:
        return self.session.id

    # -- the session's life -------------------------------------------------------------

    def start(self) -> None:
        """Count the session in and start its pipeline; the drain sees it from now on. The
        pipeline's log lines carry the session's ids (`announce`)."""
        bind_session(self.session.trace_id, self.session.id)
        self.slot.count_in(self.session.config.mode)
        self.pipeline = asyncio.get_running_loop().create_task(
            self._run_pipeline(), name=f"{self.wire.tasks}-session"
        )
        self.runtime.drain.add(self)

    @property
    def finished(self) -> bool:
        return self.pipeline is not None and self.pipeline.done()

    async def _run_pipeline(self) -> None:
        self._ran = True
        session = self.session
        try:
            await session.run()
            return
        except VoxError as exc:
            exc.fatal = True
            error = exc
        except asyncio.CancelledError:
            if not self._forced:
                raise
            # The drain deadline passed: say goodbye without waiting on the client.
            session.end_reason = "server_shutdown"
            session.outbox.event_nowait(session.ended_event())
            session.outbox.close_nowait()
            return
        except Exception:
            log.exception("session pipeline failed")
            error = internal_error()
        if session.outbox.stalled:  # the client reads nothing: the connection closes instead
            session.end_reason = error.code.value
            return
        await self.end_fatally(error)

    def begin_drain(self) -> None:
        """pipeline/drain.py: stop taking input, finish the turn in progress."""
        if self._drain_task is None and not self.finished:
            self._drain_task = asyncio.get_running_loop().create_task(
                self.session.drain(), name="voxserve-drain-session"
            )

    def force_end(self) -> None:
        """pipeline/drain.py: the deadline passed; end now with `server_shutdown`."""
        if self.pipeline is not None and not self.pipeline.done():
            self._forced = True
            self.pipeline.cancel()
        elif self._parked is not None:
            self.close()  # parked and over: nobody will come back for the goodbye

    def close(self) -> None:
        """The session is over for good: stop its pipeline if it still runs, give back
        its slot, count it, leave the drain. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._parked is not None:
            self._parked.remove(self)
            self._parked = None
        if self._expiry is not None:
            self._expiry.cancel()
        if self.pipeline is not None and not self.pipeline.done():
            self.pipeline.cancel()
        if self._drain_task is not None and not self._drain_task.done():
            self._drain_task.cancel()
        if not self._ran:  # cancelled before it began: nothing else gives the buffers back
            self.session.release()
        self.slot.release()
        self.runtime.metrics.session_counts(self.session.ended_event())
        self.runtime.drain.discard(self)

    async def wait_closed(self) -> None:
        """Wait for the pipeline task to end after close() cancelled it."""
        pipeline = self.pipeline
        if pipeline is None:
            return
        await asyncio.wait([pipeline])
        if not pipeline.cancelled() and (error := pipeline.exception()) is not None:
            log.error("session task failed", exc_info=error)

    # -- parking (session_parking.py) ---------------------------------------------------

    @property
    def parkable(self) -> bool:
        """Whether the session may wait for its client to come back: asked for, still
        running, not ending, and not ended for a client that stopped reading."""
        session = self.session
        return (
            session.config.resumable
            and not session.outbox.stalled
            and not self.finished
            and not self.closing
        )

    def park(self, parked: ParkedSessions, window_s: float) -> None:
        """The client dropped mid-session: keep it `window_s` for a resume. The outbox's
        stall limit is off meanwhile (nobody is reading, by definition)."""
        self.session.outbox.stall_s = None
        parked.put(self)
        self._parked = parked
        self._expiry = asyncio.get_running_loop().call_later(window_s, self._expire)
        log.info("session parked", extra={"resume_window_s": window_s})

    def resume(self) -> None:
        """Taken back by a reconnecting client (ParkedSessions.take)."""
        self._parked = None
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self.session.resumed()
        if self.wire.stalls:
            self.session.outbox.stall_s = self.runtime.settings.limits.stalled_client_s

    def _expire(self) -> None:
        self._expiry = None
        if self._parked is not None:
            log.info("parked session expired")
            self.close()

    # -- a connection attached ----------------------------------------------------------

    def announce(self, *, resumed: bool = False) -> None:
        """Bind the log context of this connection: its lines, and those of the tasks it
        starts (they copy the context), carry the trace and session ids; never the audio
        or the text."""
        session = self.session
        bind_session(session.trace_id, session.id)
        what = "session resumed" if resumed else "session started"
        log.info(what, extra={"mode": session.config.mode, "transport": self.wire.name})

    @contextlib.asynccontextmanager
    async def attached(
        self,
        source: ClientInput[M],
        *,
        since: float,
        sender: Coroutine[Any, Any, None] | None = None,
    ) -> AsyncIterator[asyncio.Task[None]]:
        """Run the receiver (reading `source`) and the limits watcher, and `sender` if
        given, until the block ends (it gets the receiver task); then cancel, await and
        report them. `since`: when the connection opened (the idle clock starts there)."""
        self._input = source
        self.last_message_at = since
        limits = self.runtime.settings.limits
        loop, prefix = asyncio.get_running_loop(), self.wire.tasks
        tasks = []
        if sender is not None:
            self._sender = loop.create_task(sender, name=f"{prefix}-sender")
            tasks.append(self._sender)
        receiver = loop.create_task(self._receive(source), name=f"{prefix}-receiver")
        tasks += [receiver, loop.create_task(self._watch(limits), name=f"{prefix}-limits")]
        try:
            yield receiver
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            source.release()  # held audio is counted in the session, either way
            self._input = self._sender = None
            for result in results:
                if isinstance(result, BaseException) and not isinstance(
                    result, asyncio.CancelledError
                ):
                    log.error("session task failed", exc_info=result)
            log.info("session closed", extra={"transport": self.wire.name})

    async def serve(
        self, source: ClientInput[M], sender: Coroutine[Any, Any, None], *, since: float
    ) -> None:
        """`attached` with a sender task: until the sender (the session is over) or the
        receiver (the client is gone) ends, or the pipeline ends because the client
        stalled (it reads nothing, so the sender never would). A pipeline that ends
        otherwise leaves the goodbye to the sender."""
        async with self.attached(source, since=since, sender=sender) as receiver:
            assert self._sender is not None
            ends: set[asyncio.Task[None]] = {self._sender, receiver}
            pipeline = self.pipeline
            if pipeline is not None and not pipeline.done():
                done, _ = await asyncio.wait(ends | {pipeline}, return_when=asyncio.FIRST_COMPLETED)
                if done & ends or self.session.outbox.stalled:
                    return
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)

    def release_input(self) -> None:
        """Session.release_input: the attached connection hands over what it holds."""
        source = self._input
        if source is not None:
            source.release()

    async def _receive(self, source: ClientInput[M]) -> None:
        """Read the client's messages until its input ends; an error in one message is
        reported and the session goes on, a fatal one ends it."""
        session = self.session
        while True:
            message = await source.receive()
            self.last_message_at = time.monotonic()  # read by the limits watcher
            if isinstance(message, InputEnd):
                if message is InputEnd.CLOSED:
                    self.input_open = False
                    await session.end_input()
                return
            if self.closing:
                continue  # a fatal error was sent; the session ends after it
            try:
                item = source.decode(message)
                if isinstance(item, list):
                    if await self._charged(item):
                        await feed_frames(session, item)
                else:
                    await apply_control(session, item)
            except BadAudio as bad:
                session.rejected += 1
                await self.report(bad.error)
            except VoxError as exc:
                await self.report(exc)

    async def _watch(self, limits: LimitsConfig) -> None:
        """End a session whose client went silent (`idle_timeout_s`, while it may still
        send) or that has lasted `max_session_s`. A task of its own, so the receive path
        pays one clock read per message, not a timer."""
        idle = limits.idle_timeout_s
        expires_at = self.session.started_at + limits.max_session_s
        while not self.closing:
            now = time.monotonic()
            if now >= expires_at:
                await self.end_fatally(limit_error(limits, expired=True))
                return
            wake_at = expires_at
            if self.input_open:
                if now - self.last_message_at >= idle:
                    await self.end_fatally(limit_error(limits, expired=False))
                    return
                wake_at = min(wake_at, self.last_message_at + idle)
            await asyncio.sleep(wake_at - now + 0.001)

    # -- audio and the key's quota --------------------------------------------------------

    def charge_audio(self, seconds: float, frames: int = 1) -> AudioVerdict:
        """The one place audio meets the key's audio minute. Over it the message is
        refused (its frames counted in `rejected`; one non-fatal `quota_exceeded` per run
        of refusals, in the verdict, for the caller to send) and the session goes on, so
        audio already accepted is still finished."""
        verdict = self.slot.quota.audio(seconds)
        if not verdict.accepted:
            self.session.rejected += frames
            if verdict.report is not None:
                self.count(verdict.report.code)
        return verdict

    async def _charged(self, frames: Frames) -> bool:
        """`charge_audio` for one message, its report sent (waiting like any event)."""
        if not self.charges_audio:
            return True
        size = sum(len(pcm) for _, pcm in frames)
        verdict = self.charge_audio(size / (2 * self.session.config.sample_rate), len(frames))
        if verdict.report is not None:
            await self.session.outbox.event(error_event(verdict.report))
        return verdict.accepted

    def take_audio_now(self, frames: Frames) -> None:
        """Session.take_audio_now for frames it has room for (the WebSocket fast path),
        charged frame by frame; a report is sent without waiting (an outbox full means a
        client not reading)."""
        self.last_message_at = now = time.monotonic()
        if self.charges_audio:
            rate = self.session.config.sample_rate
            outbox = self.session.outbox
            kept = []
            for seq, pcm in frames:
                verdict = self.charge_audio(len(pcm) / (2 * rate))
                if verdict.report is not None:
                    outbox.event_nowait(error_event(verdict.report))
                if verdict.accepted:
                    kept.append((seq, pcm))
            frames = kept
        self.session.take_audio_now(frames, now)

    # -- errors and the fatal end ---------------------------------------------------------

    def count(self, code: ErrorCode) -> None:
        """An error sent to the client, by code and transport."""
        self.runtime.metrics.errors.labels(code.value, self.wire.name).inc()

    async def report(self, error: VoxError) -> None:
        """An error in one client message: sent, and the session goes on; a fatal one
        ends it (its reason stays: it answers a message, it is not why the session ended)."""
        if error.fatal:
            await self.end_fatally(error, reason=False)
            return
        self.count(error.code)
        await self.session.outbox.event(error_event(error))

    async def end_fatally(self, error: VoxError, *, reason: bool = True) -> None:
        """End the session on `error` (a limit, a fatal message, a failed pipeline); the
        first wins. Audio received before is taken first. On an in-band wire the error
        and `session.ended` (reason: the error's code, if `reason`) are queued, then the
        end; otherwise the output ends and the transport reads `fatal`."""
        if self.closing:
            return
        self.release_input()
        self.closing = True
        self.count(error.code)
        session = self.session
        outbox = session.outbox
        if self.wire.in_band_end:
            if reason:
                session.end_reason = error.code.value
            await outbox.event(error_event(error, session.trace_id))
            await outbox.event(session.ended_event())
        else:
            self.fatal = error
        await outbox.close()

    def end_now(self, error: VoxError) -> list[Event]:
        """End at once, past the outbox (its sender failed): the error and
        `session.ended`, for the transport to write itself."""
        self.release_input()
        self.closing = True
        self.unsent = None
        session = self.session
        session.end_reason = error.code.value
        self.count(error.code)
        return [error_event(error, session.trace_id), session.ended_event()]

    def client_stalled(self) -> None:
        """The transport saw the client read nothing for the stall time while output
        waited: the session ends as stalled (the sender, stuck on the socket, stops)."""
        self.session.outbox.stalled = True
        if self._sender is not None:
            self._sender.cancel()

    def end_stalled(self) -> None:
        """A client that reads nothing cannot be told in-band: the transport closes the
        connection; the session ends with that code (counted as the error)."""
        self.session.end_reason = ErrorCode.CLIENT_STALLED.value
        self.count(ErrorCode.CLIENT_STALLED)

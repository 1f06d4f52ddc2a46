"""One session from `session.started` to `session.ended`, whatever the transport.

The driver owns what every transport used to write again: the session's pipeline task,
the receiver and limits-watcher tasks of the connection attached to it, the key's quota
(one charge for audio, however it arrives), the fatal end, the session counts, the log
context, the drain, and the teardown that cancels, awaits and reports its tasks. A
transport opens it (`open`), `start`s it, and attaches its connection's way in
(session_input.ClientInput) with session_attachment's `attach` (a pulled response stream:
gRPC) or `serve_attached` (a sender task: the WebSocket); it keeps its codec and how it
writes and closes.

What differs between wires is said by a `Wire`: above all how a fatal error shows, as an
event followed by `session.ended` on the stream (the WebSocket), or as the call's status
after `session.ended` (gRPC, which reads `fatal` once the outbox is drained).

A session may outlive its connection: with none attached it runs on, parked
(session/parking.py), until a client resumes it or its window ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from voxserve.errors import ErrorCode, VoxError
from voxserve.events import ServerEvent, StreamConfig
from voxserve.observe.logs import bind_session
from voxserve.pipeline.outbox import Outgoing
from voxserve.pipeline.session import Session
from voxserve.runtime import Runtime
from voxserve.server.session.events import error_event, internal_error
from voxserve.server.session.input import ClientInput, Frames, Wire
from voxserve.server.session.quotas import AudioVerdict
from voxserve.server.session.slot import SessionSlot, chosen_model, new_session

log = logging.getLogger(__name__)


class AttachedConnection(Protocol):
    """The connection attached now, as the driver sees it (session_attachment.Attachment,
    which drives the driver: it is named here only by what the driver asks of it)."""

    @property
    def source(self) -> ClientInput[Any]: ...

    def stop_sending(self) -> None: ...

    async def input_over(self, quiet_s: float) -> None: ...


class ParkingLot(Protocol):
    """Where a session waits for its client (session_parking.ParkedSessions)."""

    def remove(self, driver: SessionDriver) -> None: ...


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
        self.last_message_at = time.monotonic()  # read by the limits watcher
        self.unsent: Outgoing | None = None  # taken from the outbox, not written (resent)
        # fixed for the session's life
        self.charges_audio = wire.charges_audio and slot.quota.charges_audio
        self.attachment: AttachedConnection | None = None  # the connection attached now
        self._ran = False  # the pipeline task began (it releases the session then)
        self._forced = False
        self._failure_logged = False
        self._drain_task: asyncio.Task[None] | None = None
        self.parked_in: ParkingLot | None = None  # waiting there for its client
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

    @classmethod
    async def open_with_model(
        cls,
        runtime: Runtime,
        config: StreamConfig,
        *,
        wire: Wire,
        principal: str,
        owner: str | None = None,
    ) -> SessionDriver:
        """`open` for a config that may name an ASR model: the model is loaded first (once,
        whoever asks at the same time) and held until the session holds it itself, so
        nothing is looked up per frame. Its errors (`unknown_model`, `model_unavailable`)
        are fatal, as `open`'s are."""
        held = await chosen_model(runtime, config.model)
        try:
            return cls.open(runtime, lambda: config, wire=wire, principal=principal, owner=owner)
        finally:
            if held is not None:
                held.release()

    @property
    def id(self) -> str:
        return self.session.id

    # -- the session's life -------------------------------------------------------------

    def start(self) -> None:
        """Count the session in and start its pipeline; the drain sees it from now on. The
        pipeline's log lines carry the session's ids (`announce`)."""
        bind_session(self.session.trace_id, self.session.id)
        self.slot.count_in(self.session.config.mode, self.wire.name)
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
            await session.run(self._linger if self.wire.linger_s > 0 else None)
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

    async def _linger(self) -> None:
        """Before `ended`: read what the client still sends until its input is over (a
        message after its end is refused, answered and counted in `ended`; and a gRPC
        client whose call ended while it still wrote would see INTERNAL from its own
        library, not the call's status). Not while the server drains."""
        if self.attachment is not None and self.session.end_reason != "server_shutdown":
            await self.attachment.input_over(self.wire.linger_s)

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
        elif self.parked_in is not None:
            self.close()  # parked and over: nobody will come back for the goodbye

    def close(self) -> None:
        """The session is over for good: stop its pipeline if it still runs, give back
        its slot, count it, leave the drain. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.parked_in is not None:
            self.parked_in.remove(self)
        if self.pipeline is not None and not self.pipeline.done():
            self.pipeline.cancel()
        if self._drain_task is not None and not self._drain_task.done():
            self._drain_task.cancel()
        if not self._ran:  # cancelled before it began: nothing else gives the buffers back
            self.session.release()
        self.session.release_input = None  # no cycle keeps the session past the next GC
        self.slot.release()
        self.runtime.metrics.session_counts(self.session.ended_event())
        self.runtime.drain.discard(self)

    async def stop(self) -> None:
        """Cancel the pipeline if it still runs and wait for it: the output is over (a
        call's response stream), though the session is not closed yet."""
        if self.pipeline is not None and not self.pipeline.done():
            self.pipeline.cancel()
        await self.wait_closed()

    async def wait_closed(self) -> None:
        """Wait for the pipeline task to end after close() cancelled it."""
        pipeline = self.pipeline
        if pipeline is None:
            return
        await asyncio.wait([pipeline])
        if not pipeline.cancelled() and (error := pipeline.exception()) is not None:
            if not self._failure_logged:
                self._failure_logged = True
                log.error("session task failed", exc_info=error)

    # -- a connection attached ----------------------------------------------------------

    def announce(self, *, resumed: bool = False) -> None:
        """Bind the log context of this connection: its lines, and those of the tasks it
        starts (they copy the context), carry the trace and session ids; never the audio
        or the text."""
        session = self.session
        bind_session(session.trace_id, session.id)
        what = "session resumed" if resumed else "session started"
        log.info(what, extra={"mode": session.config.mode, "transport": self.wire.name})

    def release_input(self) -> None:
        """Session.release_input: the attached connection hands over what it holds."""
        if self.attachment is not None:
            self.attachment.source.release()

    # -- audio and the key's quota --------------------------------------------------------

    def charge_audio(self, nbytes: int, frames: int = 1) -> AudioVerdict:
        """The one place audio meets the key's audio minute: `nbytes` of PCM16 in `frames`
        frames. Over it the message is refused (its frames counted in `rejected`; one
        non-fatal `quota_exceeded` per run of refusals, in the verdict, for the caller to
        send) and the session goes on, so audio already accepted is still finished."""
        verdict = self.slot.quota.audio(nbytes / (2 * self.session.config.sample_rate))
        if not verdict.accepted:
            self.session.rejected += frames
            if verdict.report is not None:
                self.count(verdict.report.code)
        return verdict

    async def charged(self, frames: Frames) -> bool:
        """`charge_audio` for one message, its report sent (waiting like any event)."""
        if not self.charges_audio:
            return True
        verdict = self.charge_audio(sum(len(pcm) for _, pcm in frames), len(frames))
        if verdict.report is not None:
            await self.session.outbox.event(error_event(verdict.report))
        return verdict.accepted

    def take_audio_now(self, frames: Frames) -> None:
        """Session.take_audio_now for frames it has room for (the WebSocket fast path),
        charged frame by frame; a report is sent without waiting (an outbox full means a
        client not reading)."""
        self.last_message_at = now = time.monotonic()
        if self.charges_audio:
            outbox = self.session.outbox
            kept = []
            for seq, pcm in frames:
                verdict = self.charge_audio(len(pcm))
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

    def end_now(self, error: VoxError) -> list[ServerEvent]:
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
        if self.attachment is not None:
            self.attachment.stop_sending()

    def end_stalled(self) -> None:
        """A client that reads nothing cannot be told in-band: the transport closes the
        connection; the session ends with that code (counted as the error)."""
        self.session.end_reason = ErrorCode.CLIENT_STALLED.value
        self.count(ErrorCode.CLIENT_STALLED)

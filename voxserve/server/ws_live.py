"""A WebSocket session that can outlive its connection: the unit the drain, the session
counters and resume see.

A `LiveStream` owns the Session and its pipeline task from `session.started` to
`session.ended`. A connection attaches to it and drains its outbox; when the client drops
without ending the session and `limits.resume_window_s` > 0 the stream is parked: its
pipeline finishes the audio already accepted (results wait in the bounded outbox, where the
pipeline waits if it fills), and a client that reconnects with `session.resume` within the
window continues where it was. A parked stream not resumed in time is ended (its pipeline
cancelled, counted as ended by the client).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.outbox import Outgoing
from voxserve.pipeline.session import Session
from voxserve.runtime import Runtime

log = logging.getLogger(__name__)


class QuotaHold(Protocol):
    def release(self) -> None: ...


class LiveStream:
    def __init__(
        self,
        runtime: Runtime,
        session: Session,
        *,
        key_id: str | None,
        quota: QuotaHold | None,
        parked: ParkedStreams,
    ) -> None:
        self.runtime = runtime
        self.session = session
        self.key_id = key_id
        self.quota = quota
        self._parked = parked
        self.pipeline: asyncio.Task[None] | None = None
        self.unsent: Outgoing | None = None  # taken from the outbox, not written (resent)
        self.forced = False
        self.closing = False  # a fatal error was reported: input is ignored
        self._drain_task: asyncio.Task[None] | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def id(self) -> str:
        return self.session.id

    def start(self) -> None:
        """Count the session and start its pipeline (on the running loop)."""
        runtime = self.runtime
        mode = self.session.config.mode
        runtime.metrics.sessions_total.labels(mode).inc()
        runtime.metrics.sessions_active.labels(mode).inc()
        runtime.active_sessions += 1
        self.pipeline = asyncio.get_running_loop().create_task(
            self._run_pipeline(), name="voxserve-session"
        )
        runtime.drain.add(self)

    @property
    def finished(self) -> bool:
        return self.pipeline is not None and self.pipeline.done()

    async def _run_pipeline(self) -> None:
        session = self.session
        outbox = session.outbox
        try:
            await session.run()
        except VoxError as exc:
            exc.fatal = True
            session.end_reason = exc.code.value
            if outbox.stalled:  # the client reads nothing: the connection closes instead
                return
            await outbox.event(exc.to_event())
            await outbox.event(session.ended_event())
            await outbox.close()
        except asyncio.CancelledError:
            if not self.forced:
                raise
            # The drain deadline passed: say goodbye without waiting on the client.
            session.end_reason = "server_shutdown"
            outbox.event_nowait(session.ended_event())
            outbox.close_nowait()
        except Exception:
            log.exception("session pipeline failed")
            session.end_reason = ErrorCode.INTERNAL.value
            error = VoxError(ErrorCode.INTERNAL, "internal error; see server logs", fatal=True)
            outbox.event_nowait(error.to_event(trace_id=session.trace_id))
            outbox.event_nowait(session.ended_event())
            outbox.close_nowait()

    # -- drain (pipeline/drain.py) ------------------------------------------------------

    def begin_drain(self) -> None:
        if self._drain_task is None and not self.finished:
            self._drain_task = asyncio.get_running_loop().create_task(
                self.session.drain(), name="voxserve-drain-session"
            )

    def force_end(self) -> None:
        if self.pipeline is not None and not self.pipeline.done():
            self.forced = True
            self.pipeline.cancel()
        elif self._parked.get(self.id) is self:
            self.close()  # parked and over: nobody will come back for the goodbye

    # -- parking ------------------------------------------------------------------------

    def park(self, window_s: float) -> None:
        """The client dropped mid-session: keep the stream `window_s` for a resume. The
        outbox's stall limit is off meanwhile (nobody is reading, by definition)."""
        self.session.outbox.stall_s = None
        self._parked.put(self)
        self._expiry = asyncio.get_running_loop().call_later(window_s, self._expire)
        log.info("session parked", extra={"resume_window_s": window_s})

    def resume(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self.session.resumed()
        self.session.outbox.stall_s = self.runtime.settings.limits.stalled_client_s

    def _expire(self) -> None:
        self._expiry = None
        if self._parked.get(self.id) is self:
            log.info("parked session expired")
            self.close()

    def close(self) -> None:
        """The stream is over for good: stop the pipeline if it still runs, give back the
        session's hold on counters, quota and drain. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._parked.remove(self)
        if self._expiry is not None:
            self._expiry.cancel()
        if self.pipeline is not None and not self.pipeline.done():
            self.pipeline.cancel()
        if self._drain_task is not None and not self._drain_task.done():
            self._drain_task.cancel()
        if self.quota is not None:
            self.quota.release()
        runtime = self.runtime
        runtime.active_sessions -= 1
        runtime.metrics.sessions_active.labels(self.session.config.mode).dec()
        runtime.metrics.session_counts(self.session.ended_event())
        runtime.drain.discard(self)

    async def wait_closed(self) -> None:
        """Wait for the pipeline task to end after close() cancelled it."""
        if self.pipeline is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([self.pipeline])


class ParkedStreams:
    """Streams waiting for their client to come back, by session id."""

    def __init__(self) -> None:
        self._streams: dict[str, LiveStream] = {}

    def put(self, stream: LiveStream) -> None:
        self._streams[stream.id] = stream

    def get(self, session_id: str) -> LiveStream | None:
        return self._streams.get(session_id)

    def remove(self, stream: LiveStream) -> None:
        if self._streams.get(stream.id) is stream:
            del self._streams[stream.id]

    def take(self, session_id: str, key_id: str | None) -> LiveStream:
        """The parked stream, if this key owns it; one error for every miss (an unknown
        id, an expired one, another key's) so ids cannot be probed."""
        stream = self._streams.get(session_id)
        if stream is None or stream.key_id != key_id:
            raise VoxError(
                ErrorCode.RESUME_FAILED,
                "no session to resume with that id (it ended, expired, or was never parked)",
                fatal=True,
            )
        del self._streams[session_id]
        stream.resume()
        return stream

    def __len__(self) -> int:
        return len(self._streams)

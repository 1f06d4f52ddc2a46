"""Sessions whose client dropped mid-session, waiting for it to come back (resume).

A parked session keeps running without a connection: its pipeline
finishes the audio already accepted (results wait in the bounded outbox), and a client
that reconnects with `session.resume` within `limits.resume_window_s` takes it back;
one not resumed in time is ended. Transport-neutral: a driver runs the same with no
connection attached (its pipeline, counts, quota and drain go on); the WebSocket's
`session.resume` is what takes one back.
"""

from __future__ import annotations

import asyncio
import logging

from voxserve.errors import ErrorCode, VoxError
from voxserve.server.session.driver import SessionDriver

log = logging.getLogger(__name__)


def parkable(driver: SessionDriver) -> bool:
    """Whether a session may wait for its client to come back: asked for, still running,
    not ending, and not ended for a client that stopped reading."""
    session = driver.session
    return (
        session.config.resumable
        and not session.outbox.stalled
        and not driver.finished
        and not driver.closing
    )


class ParkedSessions:
    """Parked sessions by session id, each with the timer that ends it."""

    def __init__(self) -> None:
        self._parked: dict[str, tuple[SessionDriver, asyncio.TimerHandle]] = {}

    def park(self, driver: SessionDriver, window_s: float) -> None:
        """The client dropped mid-session: keep it `window_s` for a resume. The outbox's
        stall limit is off meanwhile (nobody is reading, by definition)."""
        driver.session.outbox.stall_s = None
        driver.parked_in = self
        expiry = asyncio.get_running_loop().call_later(window_s, self._expire, driver)
        self._parked[driver.id] = (driver, expiry)
        log.info("session parked", extra={"resume_window_s": window_s})

    def get(self, session_id: str) -> SessionDriver | None:
        entry = self._parked.get(session_id)
        return entry[0] if entry is not None else None

    def remove(self, driver: SessionDriver) -> None:
        entry = self._parked.get(driver.id)
        if entry is not None and entry[0] is driver:
            del self._parked[driver.id]
            entry[1].cancel()
            driver.parked_in = None

    def take(self, session_id: str, owner: str | None) -> SessionDriver:
        """The parked session, if this key owns it; one error for every miss (an unknown
        id, an expired one, another key's) so ids cannot be probed."""
        driver = self.get(session_id)
        if driver is None or driver.owner != owner:
            raise VoxError(
                ErrorCode.RESUME_FAILED,
                "no session to resume with that id (it ended, expired, or was never parked)",
                fatal=True,
            )
        self.remove(driver)
        session = driver.session
        session.resumed()
        if driver.wire.stalls:  # someone reads again
            session.outbox.stall_s = driver.runtime.settings.limits.stalled_client_s
        return driver

    def _expire(self, driver: SessionDriver) -> None:
        if self.get(driver.id) is driver:
            log.info("parked session expired")
            driver.close()  # which removes it

    def __len__(self) -> int:
        return len(self._parked)

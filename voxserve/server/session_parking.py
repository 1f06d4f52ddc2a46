"""Sessions whose client dropped mid-session, waiting for it to come back (resume).

A parked session keeps running without a connection (SessionDriver.park): its pipeline
finishes the audio already accepted (results wait in the bounded outbox), and a client
that reconnects with `session.resume` within `limits.resume_window_s` takes it back;
one not resumed in time is ended. The registry is the transport's (the WebSocket's
`session.resume`); parking itself is the driver's, since it is about the session's life:
its pipeline, counts, quota and drain go on without a connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from voxserve.errors import ErrorCode, VoxError

if TYPE_CHECKING:
    from voxserve.server.session_driver import SessionDriver


class ParkedSessions:
    """Parked sessions by session id."""

    def __init__(self) -> None:
        self._drivers: dict[str, SessionDriver] = {}

    def put(self, driver: SessionDriver) -> None:
        self._drivers[driver.id] = driver

    def get(self, session_id: str) -> SessionDriver | None:
        return self._drivers.get(session_id)

    def remove(self, driver: SessionDriver) -> None:
        if self._drivers.get(driver.id) is driver:
            del self._drivers[driver.id]

    def take(self, session_id: str, owner: str | None) -> SessionDriver:
        """The parked session, if this key owns it; one error for every miss (an unknown
        id, an expired one, another key's) so ids cannot be probed."""
        driver = self._drivers.get(session_id)
        if driver is None or driver.owner != owner:
            raise VoxError(
                ErrorCode.RESUME_FAILED,
                "no session to resume with that id (it ended, expired, or was never parked)",
                fatal=True,
            )
        del self._drivers[session_id]
        driver.resume()
        return driver

    def __len__(self) -> int:
        return len(self._drivers)

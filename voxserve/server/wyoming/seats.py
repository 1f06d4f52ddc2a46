"""Wyoming's own share of the server: Wyoming carries no key, so its connections are all
the one `anonymous` caller, and without a share of their own 500 of them held every
session slot of a keyed server (issue 35).

- Requests (wake, ASR, TTS) running at once over every Wyoming connection:
  `wyoming.max_sessions`, by default a quarter of `limits.max_sessions`, so the other
  three quarters are always the keyed transports'. Over it the request is refused with
  `wyoming_limit` (the connection stays, as for `overloaded`), after the global rule.
- Connections open at once: `wyoming.max_connections` in all and
  `wyoming.max_connections_per_peer` from one address, so one address cannot take the
  share, and idle connections cannot take the descriptors the HTTP server counts on (they
  are outside `limits.max_connections`). Over either the new connection gets `error`
  `wyoming_limit` and is closed before any event is read.

One book per runtime (`seats_of`), as the quota book is; Wyoming is served by one process.
"""

from __future__ import annotations

import weakref
from collections import Counter

from voxserve.errors import ErrorCode, VoxError
from voxserve.runtime import Runtime
from voxserve.server.session.admission import admit
from voxserve.server.session.auth import ANONYMOUS
from voxserve.server.session.slot import SessionSlot, open_request

SHARE = 4  # the default share: limits.max_sessions // SHARE


def _refuse(message: str) -> VoxError:
    return VoxError(ErrorCode.WYOMING_LIMIT, message, fatal=True)


class WyomingSeats:
    """Counts of Wyoming's connections (per peer address) and requests, against its caps."""

    def __init__(
        self, max_sessions: int, max_connections: int, max_connections_per_peer: int
    ) -> None:
        self.max_sessions = max_sessions
        self.max_connections = max_connections
        self.max_connections_per_peer = max_connections_per_peer
        self.sessions = 0
        self.peers: Counter[str] = Counter()  # open connections by address; no zero entries

    @property
    def connections(self) -> int:
        return self.peers.total()

    def connect(self, peer: str) -> None:
        """Count a new connection from `peer`; `wyoming_limit` (nothing counted) over a cap.
        Give it back with `disconnect` exactly once."""
        if self.connections >= self.max_connections:
            raise _refuse(f"Wyoming is at its limit of {self.max_connections} connections")
        if self.peers[peer] >= self.max_connections_per_peer:
            raise _refuse(
                f"this address has its limit of {self.max_connections_per_peer} Wyoming connections"
            )
        self.peers[peer] += 1

    def disconnect(self, peer: str) -> None:
        self.peers[peer] -= 1
        if self.peers[peer] <= 0:
            del self.peers[peer]

    def check_session(self) -> None:
        """`wyoming_limit` when Wyoming's requests fill its share."""
        if self.sessions >= self.max_sessions:
            raise _refuse(
                f"Wyoming is at its limit of {self.max_sessions} requests at once "
                "(wyoming.max_sessions); retry later"
            )

    def take_session(self) -> Seat:
        """One request's place in the share (`check_session` first); released once."""
        self.check_session()
        self.sessions += 1
        return Seat(self)


class Seat:
    """One request's place in Wyoming's share; `release` is idempotent."""

    def __init__(self, seats: WyomingSeats) -> None:
        self._seats: WyomingSeats | None = seats

    def release(self) -> None:
        seats, self._seats = self._seats, None
        if seats is not None:
            seats.sessions -= 1


class WyomingSlot:
    """A one-shot Wyoming request's hold: its place in the share and its session slot."""

    def __init__(self, seat: Seat, slot: SessionSlot) -> None:
        self._seat = seat
        self._slot = slot

    def release(self) -> None:
        self._slot.release()
        self._seat.release()


def open_wyoming(runtime: Runtime, mode: str) -> WyomingSlot:
    """A Wyoming request: the global rule (a full server says `overloaded`, which says
    more), Wyoming's share, then as any request of the anonymous caller (session_slot's
    `open_request`: its quota slot taken, counted in)."""
    admit(runtime)
    seats = seats_of(runtime)
    seats.check_session()
    slot = open_request(runtime, ANONYMOUS, mode)
    return WyomingSlot(seats.take_session(), slot)


_BOOKS: weakref.WeakKeyDictionary[Runtime, WyomingSeats] = weakref.WeakKeyDictionary()


def seats_of(runtime: Runtime) -> WyomingSeats:
    """The one book of `runtime`, made on first use from its settings."""
    book = _BOOKS.get(runtime)
    if book is None:
        settings = runtime.settings
        wyoming = settings.wyoming
        share = wyoming.max_sessions or max(1, settings.limits.max_sessions // SHARE)
        book = _BOOKS[runtime] = WyomingSeats(
            share, wyoming.max_connections, wyoming.max_connections_per_peer
        )
    return book

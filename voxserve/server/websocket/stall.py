"""Whether a WebSocket client still reads what it is sent: pings as read receipts.

A client that stops reading must be ended with `client_stalled` after
`limits.stalled_client_s`. What the server could see before did not tell it in time: the
outbox (256 messages) fills only after the socket buffers on both sides have filled, which
at the pace of real-time audio takes minutes, and the keepalive (a ping every 20 s, its
pong due 20 s later) closed the connection first, with 1011.

A client answers a ping only after it has read everything sent before it (frames arrive in
order; browsers, websockets and every RFC 6455 client answer on their own). So output is
followed by a ping, once `PROBE_BYTES` have been written since the last one or a third of
`stall_s` after the first byte not yet followed by one (few pings: one per second of
16 kHz audio, one per few seconds of events), and its pong confirms everything up to it,
whatever the buffers in between hold. The client is stalled when output waits unconfirmed
and no pong has come for `stall_s`: from the oldest unanswered ping or from the last pong,
whichever is later. So a client that stops reading is ended between `stall_s` and
4/3 x `stall_s` after (sooner the more output there is). Before saying so the probe looks
once more a moment later, so a pong already in the socket's buffer (a loop that ran late,
reading just resumed) is read first; and while the server itself is not reading the
socket (its app busy), no pong could be read, so nobody is stalled then.

`StallWatch` is a connection's side of it: the protocol (server/websocket/fastpath.py) tells it
of output written (`wrote`), of every pong (`heard`) and of its keepalive's missing pong
(`keepalive_missed`), and supplies the ping, the close and whether it reads; the session
(the app's `on_stall`, while it runs) is told once. The probe starts with the session's
first output; the keepalive's missing pong counts as a stall while output waits unread,
and stays uvicorn's (1011) without output.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol

PAYLOAD_PREFIX = b"vx"  # 6-byte payloads: never uvicorn's keepalive ping (4 bytes)
PROBE_BYTES = 32 * 1024
MAX_IN_FLIGHT = 64
CONFIRM_S = 0.1  # the second look before a stall is declared


class ReadProbe:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        stall_s: float,
        send_ping: Callable[[bytes], bool],
        on_stall: Callable[[], None],
        reading: Callable[[], bool],
    ) -> None:
        self.loop = loop
        self.stall_s = stall_s
        self.max_delay = stall_s / 3  # from output to the ping that follows it
        self._send_ping = send_ping  # False when the connection can no longer send one
        self._on_stall = on_stall
        self._reading = reading  # whether the server reads the socket now
        self._in_flight: deque[tuple[bytes, float]] = deque()
        self._last_heard = loop.time()
        self._unprobed = 0  # bytes written since the last ping
        self._seq = 0
        self._ping_timer: asyncio.TimerHandle | None = None
        self._check_timer: asyncio.TimerHandle | None = None
        self._confirming = False
        self.stopped = False

    @property
    def waiting(self) -> bool:
        """Output was sent that the client has not confirmed reading."""
        return bool(self._in_flight) or self._unprobed > 0

    def wrote(self, size: int) -> None:
        """`size` bytes of output went to the transport: a ping follows (module docstring)."""
        if self.stopped:
            return
        self._unprobed += size
        if self._unprobed >= PROBE_BYTES:
            self._ping()
        elif self._ping_timer is None:
            self._ping_timer = self.loop.call_later(self.max_delay, self._ping)

    def heard(self, payload: bytes) -> None:
        """A pong: the client read everything sent before its ping (a pong may answer only
        the latest of several pings, RFC 6455 5.5.3, so it confirms every earlier one too)."""
        self._last_heard = self.loop.time()
        self._confirming = False
        in_flight = self._in_flight
        if any(sent == payload for sent, _ in in_flight):
            while in_flight and in_flight.popleft()[0] != payload:
                pass
        self._arm_check()

    def stop(self) -> None:
        self.stopped = True
        for timer in (self._ping_timer, self._check_timer):
            if timer is not None:
                timer.cancel()
        self._ping_timer = self._check_timer = None

    def _ping(self) -> None:
        if self._ping_timer is not None:
            self._ping_timer.cancel()
            self._ping_timer = None
        if self.stopped or len(self._in_flight) >= MAX_IN_FLIGHT:
            return
        self._seq += 1
        payload = PAYLOAD_PREFIX + self._seq.to_bytes(4, "big")
        if not self._send_ping(payload):
            return
        self._unprobed = 0
        self._in_flight.append((payload, self.loop.time()))
        if self._check_timer is None:
            self._arm_check()

    def _due(self) -> float:
        return max(self._in_flight[0][1], self._last_heard) + self.stall_s

    def _arm_check(self) -> None:
        if self._check_timer is not None:
            self._check_timer.cancel()
            self._check_timer = None
        if self._in_flight and not self.stopped:
            self._check_timer = self.loop.call_at(self._due(), self._check)

    def _check(self) -> None:
        self._check_timer = None
        if self.stopped or not self._in_flight:
            return
        now = self.loop.time()
        if not self._reading():
            self._last_heard = now  # no pong can be read meanwhile: the clock waits
            self._confirming = False
        if now < self._due():
            self._arm_check()
            return
        if not self._confirming:
            self._confirming = True
            self._check_timer = self.loop.call_later(CONFIRM_S, self._check)
            return
        self.stop()
        self._on_stall()


class StallSwitch(Protocol):
    """Where the app installs its session's end for a stalled client (server/websocket/fastpath.py
    `FastPath`): `on_stall` is called once, and only while it is installed."""

    on_stall: Callable[[], None] | None
    stall_s: float | None


class StallWatch:
    """One connection's stalled-reader check (module docstring)."""

    __slots__ = ("_close", "_loop", "_reading", "_send_ping", "_switch", "probe")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        switch: StallSwitch,
        send_ping: Callable[[bytes], bool],
        reading: Callable[[], bool],
        close: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._switch = switch
        self._send_ping = send_ping  # False when the connection can no longer send one
        self._reading = reading
        self._close = close  # closes the connection as `client_stalled`
        self.probe: ReadProbe | None = None  # made at the session's first output

    def wrote(self, size: int) -> None:
        """`size` bytes of output went to the transport: the session's probe pings behind."""
        probe = self.probe
        if probe is None:
            switch = self._switch
            if switch.on_stall is None or switch.stall_s is None:
                return
            probe = self.probe = ReadProbe(
                self._loop, switch.stall_s, self._send_ping, self.stalled, self._reading
            )
        probe.wrote(size)

    def heard(self, payload: bytes) -> None:
        """A pong (the keepalive's confirms too)."""
        if self.probe is not None:
            self.probe.heard(payload)

    def keepalive_missed(self) -> bool:
        """The keepalive's pong did not come: whether that is a stalled reader (output waits
        unread while the session runs), to be ended with `stalled`, not by the keepalive."""
        probe = self.probe
        return (
            probe is not None
            and probe.waiting
            and not probe.stopped
            and self._switch.on_stall is not None
        )

    def stalled(self) -> None:
        """The client read nothing for the stall time while output waited: the session is
        ended (`on_stall`, once), then the connection closed."""
        self.stop()
        switch = self._switch
        on_stall = switch.on_stall
        if on_stall is None:
            return  # the session is over already
        switch.on_stall = None
        on_stall()
        self._close()

    def stop(self) -> None:
        """No more pings or checks: the connection closes or is lost."""
        if self.probe is not None:
            self.probe.stop()

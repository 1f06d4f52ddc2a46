"""The read probe (server/websocket/stall.py) on a virtual clock, over generated schedules of output
and clients: a client that answers every ping within less than the stall time is never
stalled, however the output comes; one that stops answering is stalled no sooner than the
stall time after its last pong and no later than 4/3 of it after output waits on it; and
while the server itself does not read the socket, nobody is stalled."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from voxserve.server.websocket.stall import CONFIRM_S, ReadProbe, StallWatch

STALL_S = 3.0


class Timer:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualLoop:
    """What the probe uses of an event loop, on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., None], *args: Any) -> Timer:
        timer = Timer(when, lambda: callback(*args))
        heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> Timer:
        return self.call_at(self.now + delay, callback, *args)

    def run_until(self, until: float) -> None:
        while self._timers and self._timers[0][0] <= until:
            when, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self.now = max(self.now, when)
                timer.callback()
        self.now = max(self.now, until)


class Client:
    """Answers the pings sent before `stops_at`, `delay` seconds after each; none after."""

    def __init__(self, loop: VirtualLoop, delay: float, stops_at: float = float("inf")) -> None:
        self.loop = loop
        self.delay = delay
        self.stops_at = stops_at
        self.last_pong = 0.0
        self.stalled_at: float | None = None
        self.reading = True
        self.probe = ReadProbe(
            cast(Any, loop), STALL_S, self.ping, self.stalled, lambda: self.reading
        )

    def ping(self, payload: bytes) -> bool:
        if self.loop.now < self.stops_at:
            self.loop.call_later(self.delay, self.pong, payload)
        return True

    def pong(self, payload: bytes) -> None:
        self.last_pong = self.loop.now
        self.probe.heard(payload)

    def stalled(self) -> None:
        self.stalled_at = self.loop.now


writes = st.lists(st.tuples(st.floats(0, 30), st.integers(1, 40_000)), min_size=1, max_size=60).map(
    sorted
)


def _play(client: Client, schedule: list[tuple[float, int]], until: float) -> None:
    for at, size in schedule:
        client.loop.run_until(at)
        if client.stalled_at is None:
            client.probe.wrote(size)
    client.loop.run_until(until)


@settings(max_examples=200, deadline=None)
@given(schedule=writes, delay=st.floats(0, STALL_S - 0.01))
def test_a_client_answering_in_time_is_never_stalled(
    schedule: list[tuple[float, int]], delay: float
) -> None:
    client = Client(VirtualLoop(), delay)
    _play(client, schedule, until=60)
    assert client.stalled_at is None


@settings(max_examples=200, deadline=None)
@given(
    before=writes,
    after=writes,
    stops_at=st.floats(0, 20),
    delay=st.floats(0, 1.0),
)
def test_a_client_that_stops_answering_is_stalled_in_time(
    before: list[tuple[float, int]],
    after: list[tuple[float, int]],
    stops_at: float,
    delay: float,
) -> None:
    loop = VirtualLoop()
    client = Client(loop, delay, stops_at)
    # Output before the stop, then output after it (shifted past it).
    schedule = [w for w in before if w[0] < stops_at] + [(stops_at + t, n) for t, n in after]
    first_after = schedule[-len(after)][0]
    _play(client, schedule, until=stops_at + 200)
    assert client.stalled_at is not None
    assert client.stalled_at >= client.last_pong + STALL_S - 1e-9
    latest = max(first_after + STALL_S / 3, stops_at + delay) + STALL_S + CONFIRM_S
    assert client.stalled_at <= latest + 1e-9, (client.stalled_at, latest)


def test_no_stall_while_the_server_does_not_read() -> None:
    """Pongs cannot be read while the server's app keeps the socket unread: no stall then,
    and none before the server has read again (a pong waiting in its buffer comes first)."""
    for answers_on_resume in (False, True):
        loop = VirtualLoop()
        client = Client(loop, delay=0.1, stops_at=0.0)  # answers nothing by itself
        client.reading = False
        client.probe.wrote(1000)
        loop.run_until(20)
        assert client.stalled_at is None
        client.reading = True
        if answers_on_resume:  # the pong that waited in the server's receive buffer
            loop.call_later(0.01, client.pong, b"vx\x00\x00\x00\x01")
        loop.run_until(20 + STALL_S + 2 * CONFIRM_S)
        if answers_on_resume:
            assert client.stalled_at is None
        else:
            assert client.stalled_at is not None
            assert 20 + CONFIRM_S - 1e-9 <= client.stalled_at <= 20 + STALL_S + CONFIRM_S


def test_output_waits_only_until_its_ping_is_answered() -> None:
    loop = VirtualLoop()
    client = Client(loop, delay=0.5)
    client.probe.wrote(100)
    assert client.probe.waiting
    loop.run_until(STALL_S / 3 + 0.6)
    assert not client.probe.waiting
    client.probe.wrote(40_000)  # over PROBE_BYTES: pinged at once
    loop.run_until(loop.now + 0.6)
    assert not client.probe.waiting


class Connection:
    """What a StallWatch is given: a session's switch, pings that are never answered, the
    close; and what happened to it."""

    def __init__(self, loop: VirtualLoop) -> None:
        self.on_stall: Callable[[], None] | None = self.session_ended
        self.stall_s: float | None = STALL_S
        self.ended = self.closed = 0
        self.pings: list[bytes] = []
        self.watch = StallWatch(cast(Any, loop), self, self.ping, lambda: True, self.close)

    def ping(self, payload: bytes) -> bool:
        self.pings.append(payload)
        return True

    def session_ended(self) -> None:
        self.ended += 1

    def close(self) -> None:
        self.closed += 1


def test_the_watch_probes_from_the_sessions_first_output_and_ends_it_once() -> None:
    loop = VirtualLoop()
    connection = Connection(loop)
    assert not connection.watch.keepalive_missed()  # no output yet: uvicorn's keepalive
    connection.watch.wrote(100)
    loop.run_until(STALL_S / 3)
    assert connection.pings and connection.watch.probe is not None
    assert connection.watch.keepalive_missed()  # output waits unread
    loop.run_until(2 * STALL_S)
    assert (connection.ended, connection.closed) == (1, 1)  # by the probe
    connection.watch.stalled()  # the keepalive too, later: nothing more
    assert (connection.ended, connection.closed) == (1, 1)
    assert connection.on_stall is None


def test_the_watch_leaves_a_connection_without_a_session_alone() -> None:
    loop = VirtualLoop()
    connection = Connection(loop)
    connection.on_stall = connection.stall_s = None  # no session runs
    connection.watch.wrote(100)
    loop.run_until(3 * STALL_S)
    assert connection.watch.probe is None and not connection.pings
    assert not connection.watch.keepalive_missed()
    assert (connection.ended, connection.closed) == (0, 0)

"""A deadline on each item of a blocking stream whose API has none per item (Ray Serve's
response generator, a gRPC response stream): the call is cancelled when an item is late.

Used by the cluster gateway (cluster/calls.py) and by engines that front a remote runtime
(engines/cosyvoice_grpc.py): a server that stalls must fail the call within its time, not
hold a client in silence. Every stream's deadlines are kept by one watchdog thread (a
timer thread per item would start a thread per audio chunk of every stream).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any


class ChunkLate(Exception):
    """No item came within the deadline; the call was cancelled."""


class _Alarm:
    """One item's deadline: `fire` runs once if it is neither met nor withdrawn in time."""

    __slots__ = ("fire", "fired", "settled")

    def __init__(self, fire: Callable[[], object]) -> None:
        self.fire = fire
        self.fired = False
        self.settled = False  # fired, or met (withdrawn)


class Watchdog:
    """One daemon thread that fires the due alarms of every stream, earliest first."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._due: list[tuple[float, int, _Alarm]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, timeout_s: float, fire: Callable[[], object]) -> _Alarm:
        alarm = _Alarm(fire)
        with self._cv:
            heapq.heappush(self._due, (time.monotonic() + timeout_s, next(self._order), alarm))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="voxserve-chunk-deadlines", daemon=True
                )
                self._thread.start()
            self._cv.notify()
        return alarm

    def met(self, alarm: _Alarm) -> bool:
        """Withdraw `alarm` (its item came); False when it had already fired."""
        with self._cv:
            alarm.settled = True
            alarm.fire = _nothing  # the call is not kept alive until the deadline passes
            return not alarm.fired

    def _run(self) -> None:
        with self._cv:
            while True:
                while self._due and self._due[0][2].settled:
                    heapq.heappop(self._due)
                if not self._due:
                    self._cv.wait()
                    continue
                wait_s = self._due[0][0] - time.monotonic()
                if wait_s > 0:
                    self._cv.wait(wait_s)
                    continue
                alarm = heapq.heappop(self._due)[2]
                alarm.fired = alarm.settled = True
                fire, alarm.fire = alarm.fire, _nothing
                self._cv.release()  # a cancel may block: never under the lock
                try:
                    with contextlib.suppress(BaseException):  # the call's failure: its reader's
                        fire()
                finally:
                    self._cv.acquire()


def _nothing() -> None:
    """What a settled alarm fires: nothing (it holds no reference to its call)."""


_WATCHDOG = Watchdog()


def with_chunk_deadline(response: Any, timeout_s: float) -> Iterator[Any]:
    """Iterate `response` (an iterator with `cancel()`); an item later than `timeout_s`
    (the first, or since the one before) cancels the call and raises ChunkLate."""
    while True:
        alarm = _WATCHDOG.arm(timeout_s, response.cancel)
        try:
            item = next(response)
        except BaseException as exc:
            on_time = _WATCHDOG.met(alarm)
            if isinstance(exc, StopIteration):
                return
            if not on_time and isinstance(exc, Exception):  # the cancel's own error
                raise ChunkLate() from None
            raise
        if not _WATCHDOG.met(alarm):  # it came as the deadline fired: cancelled all the same
            raise ChunkLate()
        yield item

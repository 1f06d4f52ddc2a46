"""with_chunk_deadline (engines/chunk_deadline.py): an item that comes just as its deadline
cancels the call is a late item, not a stream that then fails with the cancel's error."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest

from voxserve.engines.chunk_deadline import ChunkLate, with_chunk_deadline


class ArrivesAsCancelled:
    """A call whose first item is handed over only once the timer has cancelled it (the
    race, made certain); after the cancel every next item fails, as a cancelled gRPC call's
    does (CANCELLED)."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def __iter__(self) -> ArrivesAsCancelled:
        return self

    def __next__(self) -> bytes:
        if self.cancelled.is_set():
            raise RuntimeError("CANCELLED")
        assert self.cancelled.wait(10)
        return b"late"

    def cancel(self) -> None:
        self.cancelled.set()


def test_an_item_that_comes_as_the_deadline_fires_is_late() -> None:
    with pytest.raises(ChunkLate):
        list(with_chunk_deadline(ArrivesAsCancelled(), 0.01))


class Paced:
    """A call that hands over `items` items, `gap_s` apart, then ends (or stalls: `stall`)."""

    def __init__(self, items: int, gap_s: float, stall: bool = False) -> None:
        self.left, self.gap_s, self.stall = items, gap_s, stall
        self.cancelled = threading.Event()

    def __iter__(self) -> Paced:
        return self

    def __next__(self) -> int:
        if self.cancelled.wait(self.gap_s):
            raise RuntimeError("CANCELLED")
        if self.left == 0:
            if not self.stall:
                raise StopIteration
            assert self.cancelled.wait(10), "the stalled call was never cancelled"
            raise RuntimeError("CANCELLED")
        self.left -= 1
        return self.left

    def cancel(self) -> None:
        self.cancelled.set()


def test_streams_on_time_are_never_cancelled_and_a_stalled_one_is() -> None:
    """Twenty streams of 25 items each, 10 ms apart under a 0.5 s deadline, beside one
    that stalls after 3 items: the stalled one fails late within its deadline, the others
    are whole, and the deadlines took one watchdog thread, not a thread per item."""
    streams = [Paced(25, 0.01) for _ in range(20)]
    stalled = Paced(3, 0.01, stall=True)
    results: dict[int, object] = {}
    threads_seen: list[int] = []

    def read(i: int, call: Paced) -> None:
        try:
            results[i] = list(with_chunk_deadline(call, 0.5))
        except ChunkLate:
            results[i] = "late"
        threads_seen.append(threading.active_count())

    before = threading.active_count()
    readers = [threading.Thread(target=read, args=(i, s)) for i, s in enumerate(streams)]
    readers.append(threading.Thread(target=read, args=(len(streams), stalled)))
    started = time.monotonic()
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(15)
    assert results[len(streams)] == "late" and stalled.cancelled.is_set()
    assert time.monotonic() - started < 3.0
    assert all(results[i] == list(range(24, -1, -1)) for i in range(len(streams))), results
    assert not any(s.cancelled.is_set() for s in streams)
    # the readers themselves, and at most the one watchdog thread besides
    assert max(threads_seen) <= before + len(readers) + 1


def test_a_finished_call_is_not_kept_alive_by_its_deadlines() -> None:
    """Each item's deadline stays queued until its time; it must not hold the call."""
    call = Paced(5, 0.05)  # the watchdog waits on each item's deadline meanwhile
    assert list(with_chunk_deadline(call, 30.0)) == [4, 3, 2, 1, 0]
    gone = weakref.ref(call)
    del call
    gc.collect()
    assert gone() is None

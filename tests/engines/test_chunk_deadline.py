"""with_chunk_deadline (engines/chunk_deadline.py): an item that comes just as its deadline
cancels the call is a late item, not a stream that then fails with the cancel's error."""

from __future__ import annotations

import threading

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

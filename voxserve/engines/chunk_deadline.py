"""A deadline on each item of a blocking stream whose API has none per item (Ray Serve's
response generator, a gRPC response stream): a timer cancels the call when an item is late.

Used by the cluster gateway (cluster/calls.py) and by engines that front a remote runtime
(engines/cosyvoice_grpc.py): a server that stalls must fail the call within its time, not
hold a client in silence.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any


class ChunkLate(Exception):
    """No item came within the deadline; the call was cancelled."""


def with_chunk_deadline(response: Any, timeout_s: float) -> Iterator[Any]:
    """Iterate `response` (an iterator with `cancel()`); an item later than `timeout_s`
    (the first, or since the one before) cancels the call and raises ChunkLate."""
    while True:
        late = threading.Event()

        def expire(late: threading.Event = late) -> None:
            late.set()
            response.cancel()

        timer = threading.Timer(timeout_s, expire)
        timer.daemon = True
        timer.start()
        try:
            item = next(response)
        except StopIteration:
            return
        except Exception:
            if late.is_set():
                raise ChunkLate() from None
            raise
        finally:
            timer.cancel()
        if late.is_set():  # it came as the timer fired: the call is cancelled all the same
            raise ChunkLate()
        yield item

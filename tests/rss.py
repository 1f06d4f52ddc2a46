"""The resident set of this test process (the in-process test servers' too), sampled on a
thread, so a test can bound how much a piece of work grows it at its peak.

A regression of what these tests bound grows the process by hundreds of MB a second inside
one native call, which no timeout can interrupt: past `abort_over` the sampler ends the test
run (exit 3, with a line on stderr) rather than let the machine run out of memory."""

from __future__ import annotations

import os
import sys
import threading
import time
from types import TracebackType

from voxserve.observe.process_memory import rss_bytes

MB = 1_000_000
ABORT_OVER = 2_000 * MB


class RssPeak:
    """`with RssPeak() as peak: ...` then `peak.growth`: the highest RSS seen while inside,
    less the RSS at the start, sampled every `every_s`."""

    def __init__(self, every_s: float = 0.01, abort_over: int = ABORT_OVER) -> None:
        self.every_s = every_s
        self.abort_over = abort_over
        self.start = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-peak", daemon=True)

    @property
    def growth(self) -> int:
        return max(self.peak, rss_bytes()) - self.start

    def __enter__(self) -> RssPeak:
        self.start = self.peak = rss_bytes()
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            if self.peak - self.start > self.abort_over:
                grown = (self.peak - self.start) // MB
                print(f"RssPeak: grew {grown} MB, over {self.abort_over // MB}", file=sys.stderr)
                os._exit(3)
            time.sleep(self.every_s)

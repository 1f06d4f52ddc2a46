"""What one live stream costs the ASR engine, learned from the streams already served, so a
burst of arrivals is admitted up to what the engine can serve, not past it.

A live session's cost shows only when its first utterance ends, seconds after it was
admitted: pressure judged from the engine's queue (flow.py) lets in everything that arrives
in those seconds (100 streams in 5 s were all admitted against 40 that fit: every final
then came 10 s late). So the share of the engine's time its finals take (the ASR batcher's
busy share) is divided among the streams that have been in long enough to be counted in it
(`settle_s`): a stream's share. A new stream is refused while the busy share plus the
shares of the streams admitted too recently to show, its own included, would pass `limit`.
Until a share is measured (a quiet or cold server, nothing settled), nothing is refused
here: what it costs is not known yet. Pure, with an injected clock: the flow monitor ticks
it and asks it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

SHARE_SMOOTHING = 0.05  # weight of the newest tick (~4 s at 200 ms ticks): finals come in bursts
MIN_BUSY = 0.05  # a busy share under this says too little to divide among the streams


class SessionDemand:
    def __init__(
        self,
        busy: Callable[[], float],
        *,
        limit: float,
        settle_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`busy`: the engine's recent busy share (1.0: every slot all the time)."""
        self._busy = busy
        self.limit = limit
        self.settle_s = settle_s
        self._clock = clock
        self._recent: deque[float] = deque()  # when each recent stream was admitted
        self.per_stream: float | None = None  # a stream's smoothed share; None: unknown

    def admitted(self) -> None:
        """A stream began (its input window was made)."""
        self._recent.append(self._clock())

    def tick(self, streams: int) -> None:
        """Learn from the busy share over the `streams` live now (the monitor's tick)."""
        self._forget_settled()
        settled = streams - len(self._recent)
        busy = self._busy()
        if settled < 1 or busy < MIN_BUSY:
            return
        share = busy / settled
        if self.per_stream is None:
            self.per_stream = share
        else:
            self.per_stream += (share - self.per_stream) * SHARE_SMOOTHING

    def refuses(self) -> bool:
        """Whether one more stream would take the engine past `limit`."""
        if self.per_stream is None:
            return False
        self._forget_settled()
        predicted = self._busy() + self.per_stream * (len(self._recent) + 1)
        return predicted > self.limit

    def _forget_settled(self) -> None:
        horizon = self._clock() - self.settle_s
        while self._recent and self._recent[0] <= horizon:
            self._recent.popleft()

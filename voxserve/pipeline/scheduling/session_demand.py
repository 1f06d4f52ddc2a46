"""What one live stream costs the ASR engine, learned from the streams already served, so a
burst of arrivals is admitted up to what the engine can serve, not past it.

A live stream's cost shows only once it asks for its first final, seconds after it was
admitted: pressure judged from the engine's queue (flow.py) lets in everything that arrives
in those seconds (100 streams in 5 s were all admitted against ~45 that fit: every final
then came 4-9 s late). So the share of the engine's time finals take (the ASR batcher's
busy share) is divided among the live streams that have asked for a final (`shown`): a
stream's share. A new stream is refused while the busy share plus the shares of the streams
that have not shown yet (live, or admitted and not yet started), its own included, would
pass `limit`. Streams that end drop out (the monitor holds their windows weakly), so
short sessions coming and going are not counted twice. Until a share is measured (a quiet
or cold server), nothing is refused here: what a stream costs is not known yet.

The share is an average, and it errs high where the engine is lightly used: a few streams'
finals run in batches of one, each paying the whole fixed cost of an engine call, while a
burst's finals batch together (CI saw one of twenty concurrent streams refused after a test
of one or two). So the share is learned only from ticks with `MIN_SHOWN` streams or more,
and the rule refuses nothing while the engine's busy share is under `floor`
(flow.asr_busy_floor, 0.5): below it, a burst is left to the queue's pressure (flow.py), as
on a cold server. Pure, with an injected clock: the flow monitor ticks it and asks it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

SHARE_SMOOTHING = 0.05  # weight of the newest tick (~4 s at 200 ms ticks): finals come in bursts
MIN_BUSY = 0.05  # a busy share under this says too little to divide among the streams
ADMITTED_FOR_S = 2.0  # an admission not followed by its stream's start is forgotten then
MIN_SHOWN = 3  # fewer streams than this say too little about a burst's batches


class SessionDemand:
    def __init__(
        self,
        busy: Callable[[], float],
        *,
        limit: float,
        floor: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`busy`: the engine's recent busy share (1.0: every slot all the time)."""
        self._busy = busy
        self.limit = limit
        self.floor = floor
        self._clock = clock
        self._admitted: deque[float] = deque()  # admissions whose stream has not started
        self.per_stream: float | None = None  # a stream's smoothed share; None: unknown

    def admitted(self) -> None:
        """Admission let a stream in; its input window is not made yet."""
        self._admitted.append(self._clock())

    def started(self) -> None:
        """A stream's input window was made: from now on it counts as a live stream."""
        if self._admitted:
            self._admitted.popleft()

    def tick(self, shown: int) -> None:
        """Learn from the busy share over the `shown` live streams (the monitor's tick)."""
        busy = self._busy()
        if shown < MIN_SHOWN or busy < MIN_BUSY:
            return
        share = busy / shown
        if self.per_stream is None:
            self.per_stream = share
        else:
            self.per_stream += (share - self.per_stream) * SHARE_SMOOTHING

    def refuses(self, unshown: int) -> bool:
        """Whether one more stream, beside `unshown` live streams that have not shown their
        cost yet, would take the engine past `limit`."""
        horizon = self._clock() - ADMITTED_FOR_S
        while self._admitted and self._admitted[0] <= horizon:
            self._admitted.popleft()  # admitted, never started (a TTS session, a failure)
        busy = self._busy()
        if self.per_stream is None or busy < self.floor:
            return False
        waiting = unshown + len(self._admitted) + 1
        return busy + self.per_stream * waiting > self.limit

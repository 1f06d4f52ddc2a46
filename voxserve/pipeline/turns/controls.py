"""What a client asked at a point in its audio (a mark, a commit, a clear, new turn
detection), kept in the client's order until VAD has read the audio written before it.

Apart from the listener because the order is the whole job: a control runs only once the
audio received before it has been read from the ring, and an exact one (a commit, a clear, a
settings change) holds VAD back from the audio received after it until it has run, so it
applies where it came in the audio; a mark only reports how far VAD got.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Control:
    """Something the client asked at a point in its audio: run by the listener's task once
    the audio written before it has been read from the ring."""

    at: int  # ring.write_total when it came
    run: Callable[[], Awaitable[None]]
    # VAD reads no audio past `at` until it has run (a mark does not need to hold VAD back:
    # it only reports how far VAD got).
    exact: bool


class Controls:
    def __init__(self) -> None:
        self._queue: deque[Control] = deque()  # marks, commits, ...: in the client's order

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, at: int, run: Callable[[], Awaitable[None]], *, exact: bool) -> None:
        self._queue.append(Control(at, run, exact))

    def clear(self) -> None:
        self._queue.clear()

    def due(self, read: int) -> bool:
        """The first one can run: the ring has been read up to it (`read`: ring.read_total)."""
        return bool(self._queue) and self._queue[0].at <= read

    def read_limit(self, read: int) -> int | None:
        """How much of the ring VAD may read: up to the first exact control (None: all)."""
        for control in self._queue:  # usually none
            if control.exact:
                return max(0, control.at - read)
        return None

    async def run_due(self, read: int) -> None:
        """Run, in order, every control the ring has been read up to."""
        queue = self._queue
        while queue and queue[0].at <= read:
            await queue.popleft().run()

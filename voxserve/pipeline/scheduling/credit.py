"""Credit windows: how much work one stream may have in flight toward the model stages.

A window is additive-increase / multiplicative-decrease, like TCP's: under pressure it
halves (never below 1), when healthy it grows back by one per tick (never above its
maximum). A stream's input window counts VAD batches of audio waiting in its ring: at most
8 by default (`flow.credit_window`, ~0.5 s at 64 ms a batch), at least 1, so a stream
under pressure still moves. Pure: the flow monitor (pipeline/scheduling/flow.py) decides when there
is pressure and calls these.
"""

from __future__ import annotations

from collections.abc import Callable


class CreditWindow:
    """A stream's window; `on_change(size)` is called whenever the size changes."""

    __slots__ = ("__weakref__", "ended", "maximum", "on_change", "shown", "shrinks", "size")

    def __init__(self, maximum: int, *, size: int | None = None) -> None:
        if maximum < 1:
            raise ValueError("a credit window is at least 1")
        self.maximum = maximum
        self.size = maximum if size is None else max(1, min(size, maximum))
        self.shrinks = 0
        self.on_change: Callable[[int], None] | None = None
        # The stream has asked the ASR engine for a final: its cost shows in the engine's
        # busy share from now on (pipeline/scheduling/session_demand.py).
        self.shown = False
        self.ended = False  # its session is over (a window in a cycle lives until a GC pass)

    def pressure(self) -> bool:
        """Halve; True if the size changed."""
        return self._set(max(1, self.size // 2), shrink=True)

    def healthy(self) -> bool:
        """Grow by one; True if the size changed."""
        return self._set(min(self.maximum, self.size + 1), shrink=False)

    def _set(self, size: int, *, shrink: bool) -> bool:
        if size == self.size:
            return False
        self.size = size
        if shrink:
            self.shrinks += 1
        if self.on_change is not None:
            self.on_change(size)
        return True


class StagePressure:
    """Judges one engine stage tick by tick: pressure is a queue longer than `queue_limit`
    (or, where the stage predicts it, held work that would start past its deadline: then
    that prediction, not the count), a smoothed wait for a slot longer than `wait_limit_s`,
    or a timeout or late start (a call that got its slot after its deadline) since the
    last tick.

    Remembers since when the pressure has lasted, for load shedding: a spell of pressure
    ends only after `calm_s` without any, so a queue that empties for a moment between
    bursts does not restart the clock."""

    __slots__ = (
        "_calm_since",
        "_late",
        "_timeouts",
        "calm_s",
        "queue_limit",
        "since",
        "under",
        "wait_limit_s",
    )

    def __init__(self, queue_limit: int, wait_limit_s: float = 0.5, calm_s: float = 0.0) -> None:
        self.queue_limit = queue_limit
        self.wait_limit_s = wait_limit_s
        self.calm_s = calm_s
        self._timeouts = 0
        self._late = 0
        self.since: float | None = None  # when the current spell of pressure began
        self._calm_since: float | None = None
        self.under = False

    def judge(
        self,
        now: float,
        *,
        waiting: int,
        timeouts: int,
        late: int,
        queue_wait: float = 0.0,
        predicted_late: float | None = None,
    ) -> bool:
        """`timeouts` and `late` are the stage's running totals; `predicted_late` the
        seconds past its deadline the held work that fares worst would start (None: the
        stage predicts nothing, and `waiting` is judged against `queue_limit`)."""
        missed = timeouts > self._timeouts or late > self._late
        self._timeouts, self._late = timeouts, late
        if predicted_late is None:
            backlog = waiting > self.queue_limit
        else:
            backlog = predicted_late > 0
        self.under = backlog or queue_wait > self.wait_limit_s or missed
        if self.under:
            self._calm_since = None
            if self.since is None:
                self.since = now
        elif self.since is not None:
            if self._calm_since is None:
                self._calm_since = now
            if now - self._calm_since >= self.calm_s:
                self.since = self._calm_since = None
        return self.under

    def lasted(self, now: float) -> float:
        """Seconds since the current spell of pressure began (0 when none)."""
        return 0.0 if self.since is None else now - self.since

"""A window of in-flight calls to one remote service (AIMD, like TCP's): the gateway's to a
core tier (cluster/credits.py), an engine's to the runtime it fronts (engines/cosyvoice_tts.py).

Refusals and deadline misses shrink the window multiplicatively; each success grows it by
`increase / window`, about `increase` per window of calls. Engine calls are blocking and run
on executor threads, so this is a thread-safe counter with a condition, not an asyncio object.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from voxserve.config import ClusterCredits


class TierCredits:
    """In-flight calls to one tier: `acquire` before a call, exactly one outcome after it."""

    def __init__(
        self,
        tier: str,
        config: ClusterCredits,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not config.min <= config.initial <= config.max:
            raise ValueError(f"cluster credits: need min <= initial <= max, got {config}")
        self.tier = tier
        self.config = config
        self.clock = clock
        self.window = float(config.initial)
        self.in_flight = 0
        self.refusals = 0  # BackPressureError from the core
        self.misses = 0  # deadline misses
        self.rejected = 0  # calls that found the window full for wait_ms
        self._cond = threading.Condition()

    @property
    def limit(self) -> int:
        """Calls allowed in flight now (the window, rounded down, at least min)."""
        return max(self.config.min, int(self.window))

    def acquire(self, wait_s: float | None = None) -> bool:
        """Take a credit, waiting up to `wait_s` (default: the configured wait_ms) for one.
        False when none came free: the caller refuses the call as overloaded."""
        wait = self.config.wait_ms / 1000 if wait_s is None else wait_s
        deadline = self.clock() + wait
        with self._cond:
            while self.in_flight >= self.limit:
                left = deadline - self.clock()
                if left <= 0:
                    self.rejected += 1
                    return False
                self._cond.wait(left)
            self.in_flight += 1
            return True

    def success(self) -> None:
        """The call finished in time: give the credit back and grow the window."""
        with self._cond:
            self.window = min(
                float(self.config.max), self.window + self.config.increase / self.window
            )
            self._release()

    def refused(self) -> None:
        """The core refused the call (its queue is full): shrink."""
        with self._cond:
            self.refusals += 1
            self._shrink()
            self._release()

    def missed(self) -> None:
        """The call missed its deadline: shrink."""
        with self._cond:
            self.misses += 1
            self._shrink()
            self._release()

    def shrink(self) -> None:
        """Pressure seen by a call whose credit was already given back."""
        with self._cond:
            self._shrink()

    def release(self) -> None:
        """The call ended without saying anything about load (cancelled, failed)."""
        with self._cond:
            self._release()

    def _shrink(self) -> None:
        self.window = max(float(self.config.min), self.window * self.config.decrease)

    def _release(self) -> None:
        self.in_flight -= 1
        self._cond.notify_all()

    def snapshot(self) -> dict[str, float | int]:
        with self._cond:
            return {
                "window": round(self.window, 2),
                "in_flight": self.in_flight,
                "refusals": self.refusals,
                "misses": self.misses,
                "rejected": self.rejected,
            }

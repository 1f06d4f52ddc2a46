"""The memory guard: new work is refused (`overloaded`) while this process's resident set
is over its threshold, so a burst of costly requests meets a clear refusal instead of the
kernel's OOM killer, and the work already admitted finishes.

The threshold (`limits.memory_guard_bytes`, `limits.memory_guard_fraction`) is the smaller
of an absolute byte count and a fraction of the container's memory limit (of the machine's
memory when there is none) shared among the server's worker processes; 0 turns either off.
New work means new sessions and one-shot requests (server/session/admission.py) and each synthesis
that needs the engine (a cache hit costs no engine memory: pipeline/synthesis/synthesize.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from voxserve.config import LimitsConfig
from voxserve.errors import ErrorCode, VoxError
from voxserve.observe.process_memory import machine_memory_bytes, memory_limit_bytes, rss_bytes

MIB = 1 << 20


def threshold_bytes(limits: LimitsConfig, *, workers: int = 1, ceiling: int | None = None) -> int:
    """The resident set size over which new work is refused; 0: never. `ceiling`: the
    memory the fraction applies to (default: the cgroup limit, else the machine's)."""
    found: list[int] = []
    if limits.memory_guard_bytes:
        found.append(limits.memory_guard_bytes)
    if limits.memory_guard_fraction > 0:
        total = ceiling if ceiling is not None else memory_limit_bytes() or machine_memory_bytes()
        if total > 0:
            found.append(int(total * limits.memory_guard_fraction / max(1, workers)))
    return min(found, default=0)


class MemoryGuard:
    """Says no to new work while the resident set is over `threshold` bytes (0: off)."""

    def __init__(
        self, threshold: int, *, retry_after_s: int, rss: Callable[[], int] = rss_bytes
    ) -> None:
        self.threshold = threshold  # may be changed while serving (tests, operators)
        self.retry_after_s = retry_after_s
        self._rss = rss
        self.refusals: Counter[str] = Counter()  # by what was refused: voxserve_memory_guard_*

    def check(self, what: str, *, fatal: bool = True, coming_bytes: int = 0) -> None:
        """Raise `overloaded` (with a retry hint) if the process is over its threshold, or
        would be with `coming_bytes` more (memory about to be made: an upload's next window).
        `what` ("session", "request", "synthesis", "upload") labels the refusal in the metrics."""
        if not self.threshold:
            return
        rss = self._rss() + coming_bytes
        if rss <= self.threshold:
            return
        self.refusals[what] += 1
        raise VoxError(
            ErrorCode.OVERLOADED,
            f"the server is short of memory ({rss // MIB} MiB in use, refusing new work over "
            f"{self.threshold // MIB} MiB); retry later",
            fatal=fatal,
            retry_after_s=self.retry_after_s,
        )

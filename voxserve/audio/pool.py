"""The process-wide pool of per-session sample buffers (what each session's ring lives in).

Sized as streams x per-stream maximum x 1.2 (20% headroom), i.e. `limits.max_sessions`
x 1.2 buffers of `pipeline.ring_frames` 20 ms frames (`pipeline.pool_buffers` overrides the
count). One block is reserved up front and cut into buffers; the kernel backs a page only
once it is written, so an unused buffer costs address space, not memory, and a buffer that
comes back is reused as it is (no allocation or page faults per session after warm-up).

A session takes one buffer at its start and gives it back at its end (also when the session
object is collected without having run). When every buffer is out, the session gets a plain
allocation instead: it is never refused for that, and its trace id is logged in one WARNING.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from voxserve.audio.pcm import Int16Array

if TYPE_CHECKING:
    from voxserve.config import Settings

log = logging.getLogger(__name__)

HEADROOM = 1.2  # buffers per admitted stream: streams x per-stream maximum x 1.2


def pool_buffers(settings: Settings) -> int:
    """How many buffers the pool holds: `pipeline.pool_buffers`, else max_sessions x 1.2."""
    configured = settings.pipeline.pool_buffers
    if configured is not None:
        return configured
    return math.ceil(settings.limits.max_sessions * HEADROOM)


class PoolBuffer:
    """One session's buffer: `samples` to use, `release()` to give it back (idempotent)."""

    __slots__ = ("__weakref__", "_finalizer", "pooled", "samples")

    def __init__(self, samples: Int16Array, pooled: bool) -> None:
        self.samples = samples
        self.pooled = pooled
        self._finalizer: Callable[[], object] | None = None  # a weakref.finalize

    def release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()


class BufferPool:
    """Fixed-size int16 buffers handed out and returned whole; single event-loop use."""

    def __init__(self, buffers: int, buffer_samples: int) -> None:
        if buffers < 0 or buffer_samples <= 0:
            raise ValueError("pool size must be >= 0 and buffers non-empty")
        self.capacity = buffers
        self.buffer_samples = buffer_samples
        # np.zeros of a large block is calloc'd: pages cost RSS only once written.
        self._block = np.zeros((max(buffers, 1), buffer_samples), dtype=np.int16)
        self._free = list(range(buffers - 1, -1, -1))  # pop() hands out buffer 0 first
        self.in_use = 0
        self.peak = 0
        self.fallbacks = 0  # buffers allocated outside the pool because it was empty

    @property
    def usage_ratio(self) -> float:
        return self.in_use / self.capacity if self.capacity else 1.0

    def acquire(self, trace_id: str) -> PoolBuffer:
        """A buffer for one session; a plain allocation (and one WARNING naming the
        session's trace id) when the pool is exhausted."""
        if not self._free:
            self.fallbacks += 1
            log.warning(
                "buffer pool exhausted; allocating outside the pool",
                extra={
                    "pool_trace_id": trace_id,
                    "pool_capacity": self.capacity,
                    "pool_in_use": self.in_use,
                },
            )
            return PoolBuffer(np.zeros(self.buffer_samples, dtype=np.int16), pooled=False)
        index = self._free.pop()
        self.in_use += 1
        self.peak = max(self.peak, self.in_use)
        buffer = PoolBuffer(self._block[index], pooled=True)
        buffer._finalizer = weakref.finalize(buffer, self._give_back, index)
        return buffer

    def _give_back(self, index: int) -> None:
        self._free.append(index)
        self.in_use -= 1

    def as_dict(self) -> dict[str, int | float]:
        return {
            "capacity": self.capacity,
            "buffer_bytes": self.buffer_samples * 2,
            "in_use": self.in_use,
            "peak": self.peak,
            "fallbacks": self.fallbacks,
            "usage_ratio": round(self.usage_ratio, 4),
        }

"""What a batch of n requests costs an engine: a fixed part plus a part per request, fitted
online from the batches it ran.

Batched engines share a call's overhead: a CTranslate2 batch of 8 Whisper windows costs
less than 8 batches of one, and how much less is the engine's and the machine's. A cost
per request measured on small batches over-prices a burst that will run in big ones (a
burst refused that would have fit); one per batch under-prices a single big batch. So
both parts are fitted, by least squares over exponentially weighted means of the batch
size, its time and their products: `seconds = fixed + per_item x size`. Until the sizes
seen differ (a quiet server runs batches of one), the fixed part is 0 and the whole cost
is per request: the estimate errs late, never early. `edf_finish` plays a queue of bulk
work through the batcher's order with these costs (the admission rule's prediction);
`live_lateness` plays held live finals through it (the flow monitor's pressure). Pure:
tested with made-up batches (tests/test_batch_cost.py).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

MIN_SIZE_VARIANCE = 0.1  # below this the sizes seen are too alike to split the cost


@dataclass
class BatchCost:
    smoothing: float = 0.3
    batches: int = 0
    _size: float = 0.0  # the weighted means of size, seconds, size^2, size x seconds
    _seconds: float = 0.0
    _size2: float = 0.0
    _size_seconds: float = 0.0

    def observe(self, size: int, seconds: float) -> None:
        """A batch of `size` requests took `seconds` (the first sets the means)."""
        if size < 1 or seconds < 0:
            return
        weight = self.smoothing if self.batches else 1.0
        self.batches += 1
        self._size += (size - self._size) * weight
        self._seconds += (seconds - self._seconds) * weight
        self._size2 += (size * size - self._size2) * weight
        self._size_seconds += (size * seconds - self._size_seconds) * weight

    def parts(self) -> tuple[float, float]:
        """(fixed seconds per batch, seconds per request); (0, 0) before any batch."""
        if not self.batches or self._size <= 0:
            return 0.0, 0.0
        variance = self._size2 - self._size * self._size
        if variance < MIN_SIZE_VARIANCE:
            return 0.0, self._seconds / self._size
        per_item = (self._size_seconds - self._size * self._seconds) / variance
        per_item = max(0.0, per_item)
        fixed = self._seconds - per_item * self._size
        if fixed < 0:  # noise: a line through the origin instead
            return 0.0, self._seconds / self._size
        return fixed, per_item

    def seconds(self, items: int, batches: int) -> float:
        """What `items` requests cost run as `batches` batches."""
        fixed, per_item = self.parts()
        return batches * fixed + items * per_item

    def batch_seconds(self, size: int) -> float:
        return self.seconds(size, 1)


@dataclass(frozen=True, slots=True)
class Job:
    """Bulk work as the admission rule sees it: due `deadline_s` from now, `items` requests
    bringing `cost` of work in all."""

    deadline_s: float
    items: int
    cost: float


def edf_finish(
    jobs: list[Job],
    fit: BatchCost,
    *,
    max_batch: int,
    max_cost: float,
    slots: int,
    start_s: float = 0.0,
) -> list[float]:
    """When each job would be done (seconds from now), served as the batcher serves bulk
    work: every request in deadline order, cut into batches of at most `max_batch` requests
    and `max_cost` of work, each at the fitted cost of its size, over `slots` at once
    (spread evenly: a rough model), after `start_s` of work already running."""
    units = sorted(
        (job.deadline_s, index, job.cost / max(1, job.items))
        for index, job in enumerate(jobs)
        for _ in range(max(1, job.items))
    )
    done = [0.0] * len(jobs)
    clock, batch, cost = start_s, list[int](), 0.0
    fixed, per_item = fit.parts()  # once: every batch below is priced by the same line

    def close() -> float:
        finished = clock + (fixed + per_item * len(batch)) / max(1, slots)
        for index in batch:
            done[index] = max(done[index], finished)
        return finished

    for _, index, unit_cost in units:
        if batch and (len(batch) >= max_batch or cost + unit_cost > max_cost):
            clock, batch, cost = close(), [], 0.0
        batch.append(index)
        cost += unit_cost
    if batch:
        close()
    return done


def live_lateness(
    deadlines_s: list[float], fit: BatchCost, *, max_batch: int, free_at_s: list[float]
) -> float:
    """How late the latest of some held live requests would get its engine call, in seconds
    past its deadline (0: every one on time): `deadlines_s` (seconds from now) served in
    deadline order, `max_batch` to a batch, each batch at the fitted cost of its size on the
    slot that comes free first (`free_at_s`: when each of the engine's slots is free,
    seconds from now; 0 for an idle one). The live half of the lateness rule: a stage whose
    held finals would start late is under pressure (pipeline/scheduling/flow.py), whatever
    their count."""
    if not deadlines_s or not free_at_s:
        return 0.0
    fixed, per_item = fit.parts()
    slots = sorted(free_at_s)
    ordered = sorted(deadlines_s)
    worst = 0.0
    for first in range(0, len(ordered), max(1, max_batch)):
        batch = ordered[first : first + max(1, max_batch)]
        start = heapq.heappop(slots)
        worst = max(worst, start - batch[0])  # its earliest deadline is the batch's
        heapq.heappush(slots, start + fixed + per_item * len(batch))
    return worst

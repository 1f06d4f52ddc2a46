"""Cross-session micro-batching: requests from every session, gathered briefly, run as one
engine call through the engine's stage.

Handing work to a thread costs more than many model calls (GIL hand-offs, context switches),
and batched models share per-call overhead and matrix products. Requests are gathered for up
to `max_wait_ms` (or until `max_batch`); the wait is only taken when other requests are
expected within it (from the recent arrival rate), so a quiet server adds no latency. A
batch's deadline on the stage is its earliest member's, so batching never demotes a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.stage import EngineStage

_RETRY_ALONE = (ErrorCode.ENGINE_ERROR, ErrorCode.STAGE_TIMEOUT)
Req = TypeVar("Req")
Res = TypeVar("Res")


class Batcher(Generic[Req, Res]):
    def __init__(
        self,
        name: str,
        stage: EngineStage,
        run_many: Callable[[list[Req]], list[Res]],
        *,
        max_wait_ms: float,
        max_batch: int,
    ) -> None:
        self.name = name
        self.stage = stage
        self.run_many = run_many  # blocking; one result per request, in order
        self.max_wait_s = max_wait_ms / 1000
        self.max_batch = max(1, max_batch)
        self._pending: list[tuple[Req, float | None, asyncio.Future[Res]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task[None]] = set()  # owned here, awaited by their callers
        self._last_arrival = 0.0
        self._mean_gap_s = 1.0  # smoothed time between requests (all sessions)
        self.batches = 0
        self.requests = 0
        self.on_batch: Callable[[str, int], None] | None = None  # (engine, size): metrics

    async def submit(self, request: Req, *, deadline: float | None = None) -> Res:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Res] = loop.create_future()
        self._pending.append((request, deadline, future))
        now = loop.time()
        self._mean_gap_s += 0.1 * (min(now - self._last_arrival, 1.0) - self._mean_gap_s)
        self._last_arrival = now
        expected = self.max_wait_s / max(self._mean_gap_s, 1e-6)
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            delay = self.max_wait_s if expected >= 2.0 else 0.0
            self._timer = loop.call_later(delay, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch = [item for item in self._pending if not item[2].done()]
        self._pending = []
        if not batch:
            return
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, batch: list[tuple[Req, float | None, asyncio.Future[Res]]]) -> None:
        self.batches += 1
        self.requests += len(batch)
        if self.on_batch is not None:
            self.on_batch(self.name, len(batch))
        requests = [request for request, _, _ in batch]
        deadlines = [d for _, d, _ in batch if d is not None]
        try:
            results = await self.stage.run(
                self.run_many, requests, deadline=min(deadlines) if deadlines else None
            )
        except VoxError as exc:
            if len(batch) > 1 and exc.code in _RETRY_ALONE:
                # One poisoned request must not fail (or time out) the others batched with
                # it: each is run again on its own, and only the culprit fails (tests/faults).
                await asyncio.gather(*(self._run([item]) for item in batch))
                return
            self._fail(batch, exc)
            return
        except BaseException as exc:
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, _, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    @staticmethod
    def _fail(batch: list[tuple[Req, float | None, asyncio.Future[Res]]], exc: VoxError) -> None:
        for _, _, future in batch:
            if not future.done():
                future.set_exception(exc)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for task in self._running:
            task.cancel()

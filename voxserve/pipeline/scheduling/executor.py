"""The thread pool that runs blocking model calls for every session.

Model calls (VAD, ASR, TTS chunks) block and release the GIL, so threads give real
parallelism; but idle threads still cost memory and per-thread runtime state, and load
comes in bursts. `AdaptiveExecutor` therefore grows while work is queueing (up to
`max_workers`) and gives workers back slowly once the pressure is gone: at most one per
`idle_release_s` across the whole pool, so a pool that bursts every few seconds does not
keep paying for thread start-up.

Idle workers are kept on a stack and new work goes to the most recently idle one, so under
light load the same few threads do all the work and the rest stay idle long enough to be
released. Work is handed to a worker as the same objects the caller passed (nothing is
copied or pickled).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, TypeVarTuple

__all__ = ["AdaptiveExecutor", "ExecutorStats", "run_blocking"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")
Ts = TypeVarTuple("Ts")


@dataclass(frozen=True, slots=True)
class ExecutorStats:
    """A consistent snapshot for metrics."""

    workers: int  # threads alive (including ones still starting)
    idle_workers: int  # waiting for work
    queued: int  # submitted, not yet picked up (may include cancelled ones)
    completed: int  # tasks that ran (returned or raised)
    peak_workers: int  # most workers alive at once
    released: int  # workers given back for idleness


class _WorkItem:
    __slots__ = ("args", "fn", "future", "kwargs")

    def __init__(self, future: Future[Any], fn: Callable[..., Any], args: Any, kwargs: Any) -> None:
        self.future = future
        self.fn = fn
        self.args = args
        self.kwargs = kwargs


class _Worker:
    __slots__ = ("idle_since", "item", "name", "number", "thread", "wake")

    def __init__(self, number: int, name: str) -> None:
        self.number = number
        self.name = name
        self.wake = threading.Event()
        self.item: _WorkItem | None = None  # set by submit() when handing work directly
        self.idle_since = 0.0
        self.thread: threading.Thread | None = None


class AdaptiveExecutor(Executor):
    """A `concurrent.futures.Executor` whose thread count follows the load.

    Grows: on submit, if no worker is idle (and none is already starting for the queued
    work), one is started, up to `max_workers`. Shrinks: an idle worker exits once it has
    been idle for `idle_release_s`, nothing has had to queue for `idle_release_s`, and no
    other worker was released in the last `idle_release_s`; never below `min_workers`.
    `min_workers` threads are started at once so the first calls pay no start-up.
    """

    def __init__(
        self,
        *,
        min_workers: int = 1,
        max_workers: int | None = None,
        idle_release_s: float = 30.0,
        name_prefix: str = "voxserve-worker",
    ) -> None:
        if max_workers is None:
            max_workers = max(4, os.cpu_count() or 1)
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        if not 0 <= min_workers <= max_workers:
            raise ValueError("min_workers must be between 0 and max_workers")
        if not idle_release_s > 0:
            raise ValueError("idle_release_s must be positive (math.inf: never release)")
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.idle_release_s = idle_release_s
        self.name_prefix = name_prefix
        self._lock = threading.Lock()
        self._queue: deque[_WorkItem] = deque()
        self._idle: list[_Worker] = []  # a stack: the most recently idle worker is last
        self._workers: set[_Worker] = set()
        self._starting = 0
        self._shutdown = False
        self._completed = 0
        self._peak = 0
        self._released = 0
        self._last_pressure = -math.inf  # last time work had to queue
        self._last_release = -math.inf
        with self._lock:
            for _ in range(min_workers):
                self._start_worker()

    # --- Executor API ---------------------------------------------------------------------

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Schedule fn(*args, **kwargs); a cancelled future's task never starts."""
        future: Future[T] = Future()
        item = _WorkItem(future, fn, args, kwargs)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new work after shutdown")
            if self._idle:
                worker = self._idle.pop()
                worker.item = item
                worker.wake.set()
                return future
            self._queue.append(item)
            self._last_pressure = time.monotonic()
            if len(self._queue) > self._starting and len(self._workers) < self.max_workers:
                try:
                    self._start_worker()
                except RuntimeError:  # no worker at all could start: refuse the task
                    self._queue.remove(item)
                    raise
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting work; queued work still runs unless `cancel_futures`.

        With `wait`, returns once every worker thread has exited.
        """
        with self._lock:
            self._shutdown = True
            cancelled = list(self._queue) if cancel_futures else []
            if cancel_futures:
                self._queue.clear()
            idle, self._idle = self._idle, []
            threads = [w.thread for w in self._workers if w.thread is not None]
        for item in cancelled:
            item.future.cancel()
        for worker in idle:
            worker.wake.set()
        if wait:
            current = threading.current_thread()
            for thread in threads:
                if thread is not current:
                    thread.join()

    # --- introspection ----------------------------------------------------------------------

    @property
    def stats(self) -> ExecutorStats:
        with self._lock:
            return ExecutorStats(
                workers=len(self._workers),
                idle_workers=len(self._idle),
                queued=len(self._queue),
                completed=self._completed,
                peak_workers=self._peak,
                released=self._released,
            )

    def __repr__(self) -> str:
        s = self.stats
        return (
            f"AdaptiveExecutor(workers={s.workers}, idle={s.idle_workers}, queued={s.queued}, "
            f"min={self.min_workers}, max={self.max_workers})"
        )

    # --- workers ----------------------------------------------------------------------------

    def _start_worker(self) -> None:
        """Start one worker; the lock is held."""
        used = {w.number for w in self._workers}
        number = next(n for n in range(1, len(used) + 2) if n not in used)
        worker = _Worker(number, f"{self.name_prefix}-{number}")
        # Daemon threads: a forgotten shutdown() must not hang interpreter exit on the
        # min_workers threads that wait for work indefinitely.
        thread = threading.Thread(target=self._run, args=(worker,), name=worker.name, daemon=True)
        worker.thread = thread
        self._workers.add(worker)
        self._starting += 1
        try:
            thread.start()
        except RuntimeError:  # out of threads: the existing workers drain the queue
            self._workers.discard(worker)
            self._starting -= 1
            if not self._workers:
                raise
            log.warning("could not start another worker thread (%d running)", len(self._workers))
            return
        self._peak = max(self._peak, len(self._workers))
        log.debug("started %s (%d workers)", worker.name, len(self._workers))

    def _run(self, worker: _Worker) -> None:
        with self._lock:
            self._starting -= 1
            item = self._next_locked(worker)
        try:
            while True:
                if item is None:
                    item = self._wait(worker)
                    if item is None:
                        return
                future = item.future
                if not future.set_running_or_notify_cancel():  # cancelled while queued
                    with self._lock:
                        item = self._next_locked(worker)
                    continue
                # The worker takes its next task, or goes back on the idle stack, *before*
                # the result is published: a caller that submits again as soon as it has
                # the result then finds this same worker idle (LIFO), and the others can
                # stay idle long enough to be released.
                try:
                    result = item.fn(*item.args, **item.kwargs)
                except BaseException as exc:
                    with self._lock:
                        self._completed += 1
                        item = self._next_locked(worker)
                    future.set_exception(exc)
                else:
                    with self._lock:
                        self._completed += 1
                        item = self._next_locked(worker)
                    future.set_result(result)
                    del result  # hold nothing of a finished task while idle
                del future
        finally:
            with self._lock:
                self._retire(worker)

    def _next_locked(self, worker: _Worker) -> _WorkItem | None:
        """Queued work for this worker, else push it on the idle stack and return None.

        The lock is held. Returns None without idling once the pool is shut down.
        """
        if self._queue:
            return self._queue.popleft()
        if not self._shutdown:
            worker.idle_since = time.monotonic()
            worker.wake.clear()
            self._idle.append(worker)
        return None

    def _wait(self, worker: _Worker) -> _WorkItem | None:
        """Wait on the idle stack for a hand-off; None when the worker should exit."""
        while True:
            with self._lock:
                item = worker.item
                if item is not None:  # submit() already took us off the idle stack
                    worker.item = None
                    return item
                if self._shutdown:
                    self._retire(worker)
                    return None
                now = time.monotonic()
                if self._may_release(worker, now):
                    self._retire(worker)  # now, so no other worker counts this one
                    self._last_release = now
                    self._released += 1
                    log.debug("released %s after idling", worker.name)
                    return None
                timeout = self._wait_timeout(worker, now)
            worker.wake.wait(timeout)

    def _release_at(self, worker: _Worker) -> float:
        since = max(worker.idle_since, self._last_pressure, self._last_release)
        return since + self.idle_release_s

    def _may_release(self, worker: _Worker, now: float) -> bool:
        return (
            len(self._workers) > self.min_workers
            and not self._queue
            and now >= self._release_at(worker)
        )

    def _wait_timeout(self, worker: _Worker, now: float) -> float | None:
        if math.isinf(self.idle_release_s):
            return None
        if len(self._workers) <= self.min_workers:
            return self.idle_release_s  # re-check now and then: the pool may have grown
        return max(self._release_at(worker) - now, 0.001)

    def _retire(self, worker: _Worker) -> None:
        """Forget an exiting worker; the lock is held."""
        self._workers.discard(worker)
        if worker in self._idle:
            self._idle.remove(worker)


async def run_blocking(executor: Executor, fn: Callable[[*Ts], T], *args: *Ts) -> T:
    """Run fn(*args) on `executor` and await it.

    If the awaiting task is cancelled (the client went away), the future is cancelled too:
    work still queued never runs; work already running finishes and its result is dropped.
    """
    future = executor.submit(fn, *args)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        future.cancel()
        raise

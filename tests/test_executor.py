"""AdaptiveExecutor: grows under queue pressure, shrinks slowly, cancels cleanly."""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, Future

import pytest

from voxserve.pipeline.scheduling.executor import AdaptiveExecutor, run_blocking

_prefixes = itertools.count(1)
WAIT = 5.0  # generous upper bound for anything that should happen "soon"


def threads_named(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"{prefix}-")]


def wait_until(condition: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.002)


@pytest.fixture
def make() -> Iterator[Callable[..., AdaptiveExecutor]]:
    """Executors with a unique thread-name prefix, always shut down and checked for leaks."""
    made: list[AdaptiveExecutor] = []

    def factory(**options: object) -> AdaptiveExecutor:
        options.setdefault("name_prefix", f"test-pool-{next(_prefixes)}")
        executor = AdaptiveExecutor(**options)  # type: ignore[arg-type]
        made.append(executor)
        return executor

    yield factory
    for executor in made:
        executor.shutdown(wait=True, cancel_futures=True)
        assert threads_named(executor.name_prefix) == []


class Gate:
    """Tasks that block until released, counting how many are running."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.running = 0
        self._lock = threading.Lock()

    def task(self, value: int = 0) -> int:
        with self._lock:
            self.running += 1
        self.open.wait(WAIT)
        return value


def grow_to(executor: AdaptiveExecutor, workers: int) -> None:
    """`workers` tasks running at once (so that many workers), then all let finish."""
    gate = Gate()
    futures = [executor.submit(gate.task) for _ in range(workers)]
    wait_until(lambda: gate.running == workers)
    gate.open.set()
    for future in futures:
        future.result(WAIT)


def test_runs_tasks_passes_arguments_by_reference_and_propagates_errors(
    make: Callable[..., AdaptiveExecutor],
) -> None:
    executor = make(min_workers=1, max_workers=2)
    payload = [1, 2, 3]

    def same(x: list[int], *, y: str) -> str:
        return y if x is payload else "copied"

    assert executor.submit(same, payload, y="ok").result(WAIT) == "ok"

    def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        executor.submit(boom).result(WAIT)
    assert list(executor.map(lambda n: n * n, range(5))) == [0, 1, 4, 9, 16]
    assert executor.stats.completed == 7


def test_thread_names_and_eager_min_workers() -> None:
    executor = AdaptiveExecutor(min_workers=2, max_workers=3)
    try:
        assert executor.stats.workers == 2
        names = {t.name for t in threads_named("voxserve-worker")}
        assert {"voxserve-worker-1", "voxserve-worker-2"} <= names
        assert executor.submit(lambda: threading.current_thread().name).result(WAIT) in names
    finally:
        executor.shutdown()
    assert executor.stats.workers == 0


def test_grows_to_max_under_load_and_never_beyond(make: Callable[..., AdaptiveExecutor]) -> None:
    executor = make(min_workers=1, max_workers=4)
    gate = Gate()
    futures = [executor.submit(gate.task, n) for n in range(10)]
    wait_until(lambda: gate.running == 4)
    time.sleep(0.05)  # nothing more may start while all four are busy
    stats = executor.stats
    assert (gate.running, stats.workers, stats.idle_workers, stats.queued) == (4, 4, 0, 6)
    assert len(threads_named(executor.name_prefix)) == 4
    gate.open.set()
    assert [f.result(WAIT) for f in futures] == list(range(10))
    stats = executor.stats
    assert (stats.peak_workers, stats.completed, stats.queued) == (4, 10, 0)


def test_does_not_grow_while_a_worker_is_idle(make: Callable[..., AdaptiveExecutor]) -> None:
    executor = make(min_workers=2, max_workers=4)
    wait_until(lambda: executor.stats.idle_workers == 2)  # both started
    names = {
        executor.submit(lambda: threading.current_thread().name).result(WAIT) for _ in range(50)
    }
    assert executor.stats.peak_workers == 2
    # the most recently idle worker gets the next task, so one thread did all of them
    assert len(names) == 1


def test_shrinks_one_worker_per_interval_down_to_min(
    make: Callable[..., AdaptiveExecutor],
) -> None:
    interval = 0.15
    executor = make(min_workers=1, max_workers=4, idle_release_s=interval)
    grow_to(executor, 4)
    load_ended = time.monotonic()

    changes: list[tuple[float, int]] = []  # (time, workers) whenever the count changed
    last = executor.stats.workers
    deadline = load_ended + 4 * interval + 1.0
    while time.monotonic() < deadline:
        workers = executor.stats.workers
        if workers != last:
            changes.append((time.monotonic(), workers))
            last = workers
        if workers == 1 and time.monotonic() - changes[-1][0] > 1.5 * interval:
            break
        time.sleep(0.002)

    assert [w for _, w in changes] == [3, 2, 1]  # one at a time, never below min
    slack = 0.03  # polling granularity and scheduling
    times = [load_ended] + [t for t, _ in changes]
    assert all(b - a >= interval - slack for a, b in itertools.pairwise(times)), times
    assert executor.stats.released == 3
    wait_until(lambda: len(threads_named(executor.name_prefix)) == 1)


def test_steady_light_load_lets_extra_workers_go(make: Callable[..., AdaptiveExecutor]) -> None:
    executor = make(min_workers=1, max_workers=3, idle_release_s=0.1)
    grow_to(executor, 3)
    deadline = time.monotonic() + 2.0
    while executor.stats.workers > 1 and time.monotonic() < deadline:
        executor.submit(time.sleep, 0.001).result(WAIT)  # one task at a time, never queued
    assert executor.stats.workers == 1


def test_infinite_interval_never_releases(make: Callable[..., AdaptiveExecutor]) -> None:
    executor = make(min_workers=0, max_workers=2, idle_release_s=math.inf)
    grow_to(executor, 2)
    time.sleep(0.05)
    assert executor.stats.workers == 2


def test_min_zero_releases_everything_then_regrows(make: Callable[..., AdaptiveExecutor]) -> None:
    executor = make(min_workers=0, max_workers=2, idle_release_s=0.05)
    assert executor.stats.workers == 0
    assert executor.submit(lambda: 7).result(WAIT) == 7
    wait_until(lambda: executor.stats.workers == 0)
    assert executor.submit(lambda: 8).result(WAIT) == 8


def test_cancelled_pending_task_never_runs(make: Callable[..., AdaptiveExecutor]) -> None:
    executor = make(min_workers=1, max_workers=1)
    gate = Gate()
    ran: list[str] = []
    blocker = executor.submit(gate.task)
    wait_until(lambda: gate.running == 1)
    pending = executor.submit(ran.append, "pending")
    assert executor.stats.queued == 1
    assert pending.cancel()
    gate.open.set()
    blocker.result(WAIT)
    executor.submit(ran.append, "after").result(WAIT)
    assert ran == ["after"]
    assert pending.cancelled()
    with pytest.raises(CancelledError):
        pending.result()
    assert executor.stats.completed == 2  # the cancelled task is not counted


def test_shutdown_runs_queued_work_and_leaves_no_threads(
    make: Callable[..., AdaptiveExecutor],
) -> None:
    executor = make(min_workers=2, max_workers=3)
    gate = Gate()
    futures = [executor.submit(gate.task, n) for n in range(6)]
    wait_until(lambda: gate.running == 3)
    threading.Timer(0.05, gate.open.set).start()
    executor.shutdown(wait=True)
    assert [f.result(0) for f in futures] == list(range(6))
    assert threads_named(executor.name_prefix) == []
    assert executor.stats.workers == 0
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(print)
    executor.shutdown()  # idempotent


def test_shutdown_can_cancel_queued_work(make: Callable[..., AdaptiveExecutor]) -> None:
    executor = make(min_workers=1, max_workers=1)
    gate = Gate()
    running = executor.submit(gate.task, 1)
    wait_until(lambda: gate.running == 1)
    queued = [executor.submit(gate.task, n) for n in range(3)]
    executor.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in queued)
    gate.open.set()
    executor.shutdown(wait=True)
    assert running.result(0) == 1
    assert gate.running == 1
    assert threads_named(executor.name_prefix) == []


def test_shutdown_from_a_worker_does_not_deadlock(make: Callable[..., AdaptiveExecutor]) -> None:
    executor = make(min_workers=2, max_workers=2)
    executor.submit(executor.shutdown, True).result(WAIT)
    wait_until(lambda: threads_named(executor.name_prefix) == [])


def test_options_are_validated() -> None:
    for options in (
        {"max_workers": 0},
        {"min_workers": 3, "max_workers": 2},
        {"min_workers": -1},
        {"idle_release_s": 0},
    ):
        with pytest.raises(ValueError):
            AdaptiveExecutor(**options)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        AdaptiveExecutor(1, 2)  # type: ignore[misc]


async def test_run_blocking_returns_and_raises(make: Callable[..., AdaptiveExecutor]) -> None:
    executor = make(min_workers=1, max_workers=2)
    assert await run_blocking(executor, lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ZeroDivisionError):
        await run_blocking(executor, lambda: 1 / 0)
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(executor, sum, [1, 2]) == 3  # a plain Executor


async def test_cancelled_caller_cancels_queued_model_work(
    make: Callable[..., AdaptiveExecutor],
) -> None:
    executor = make(min_workers=1, max_workers=1)
    gate = Gate()
    ran: list[str] = []
    blocker: Future[int] = executor.submit(gate.task)
    await asyncio.to_thread(wait_until, lambda: gate.running == 1)
    waiter = asyncio.create_task(run_blocking(executor, ran.append, "gone client"))
    await asyncio.sleep(0.01)
    assert executor.stats.queued == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    gate.open.set()
    await asyncio.wrap_future(blocker)
    await run_blocking(executor, ran.append, "next")
    assert ran == ["next"]

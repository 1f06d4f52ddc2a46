"""An engine stage: a concurrency limit shared by every session, a timeout, stage-named errors.

The limit counts work that is really running on the executor: when a caller times out or is
cancelled, a queued call is withdrawn, and a call already running keeps its slot until it
finishes, so abandoned model work can never pile up behind the limit's back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

from voxserve.errors import ErrorCode, VoxError

T = TypeVar("T")


class EngineStage:
    def __init__(self, name: str, concurrency: int, timeout_s: float, executor: Executor) -> None:
        if concurrency < 1:
            raise ValueError(f"stage {name}: concurrency must be >= 1")
        self.name = name
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self._executor = executor
        self._slots = asyncio.Semaphore(concurrency)
        self.waiting = 0  # callers queued for a slot (the stage queue length)
        self.running = 0
        self.calls = 0
        self.timeouts = 0
        self.errors = 0
        self.on_latency: Callable[[str, float], None] | None = None

    async def run(self, fn: Callable[..., T], *args: object, timeout_s: float | None = None) -> T:
        """Run `fn(*args)` on the executor under this stage's limit and deadline."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        started = time.perf_counter()
        self.calls += 1
        try:
            async with asyncio.timeout(limit):
                self.waiting += 1
                try:
                    await self._slots.acquire()
                finally:
                    self.waiting -= 1
                return await self._run_in_slot(fn, args)
        except TimeoutError:
            self.timeouts += 1
            raise VoxError(
                ErrorCode.STAGE_TIMEOUT,
                f"{self.name} did not answer within {limit:g} s",
                stage=self.name,
            ) from None
        finally:
            if self.on_latency is not None:
                self.on_latency(self.name, time.perf_counter() - started)

    def _release_slot(self) -> None:
        self.running -= 1
        self._slots.release()

    async def _run_in_slot(self, fn: Callable[..., T], args: tuple[object, ...]) -> T:
        loop = asyncio.get_running_loop()
        self.running += 1
        try:
            future = self._executor.submit(fn, *args)
        except BaseException:
            self._release_slot()
            raise

        def release(_: object) -> None:
            # Runs (on a worker thread) when the work is really over: done, failed or
            # withdrawn before it started. Counters are only touched on the loop's thread.
            try:
                loop.call_soon_threadsafe(self._release_slot)
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                pass

        future.add_done_callback(release)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()  # withdraws it if it has not started yet
            raise
        except VoxError:
            self.errors += 1
            raise
        except ValueError as exc:
            # Engines raise ValueError for bad requests (unknown voice, bad speed, ...).
            self.errors += 1
            raise VoxError(ErrorCode.INVALID_PARAMETER, str(exc), stage=self.name) from exc
        except Exception as exc:
            self.errors += 1
            raise VoxError(
                ErrorCode.ENGINE_ERROR,
                f"{self.name} engine failed ({type(exc).__name__})",
                stage=self.name,
            ) from exc

"""One bounded thread pool per class of blocking work that is not a model call: decoding
uploads, encoding speech, file I/O. Model calls have their own (`AdaptiveExecutor`,
`runtime.executor`).

asyncio's default executor is one pool for everything (min(32, cores + 4) threads): seven
slow uploads decoding filled it, and an mp3 speech request then waited minutes for a thread
to encode its first chunk. Here a flood of one class queues in its own pool only.

Within a pool, waiting jobs start by `priority`, lowest first, then in order of arrival: an
upload decoded window by window asks with the seconds it has decoded so far, so a new short
upload starts at its next free thread instead of behind every window of the long ones.
A pool never hands its executor more jobs than it has threads, so that order holds.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import ParamSpec, TypeVar

__all__ = ["WorkPool", "WorkPools"]

P = ParamSpec("P")
T = TypeVar("T")


class WorkPool:
    """`workers` threads named `voxserve-<name>`; `run` awaits a blocking call on one."""

    def __init__(self, name: str, workers: int) -> None:
        self.name = name
        self.workers = max(1, workers)
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix=f"voxserve-{name}")
        self._busy = 0  # jobs handed to the executor and not yet ended
        self._waiting: list[tuple[float, int, asyncio.Future[None]]] = []  # a heap
        self._order = itertools.count()

    @property
    def queued(self) -> int:
        return sum(1 for *_, waiter in self._waiting if not waiter.done())

    @property
    def busy(self) -> int:
        return self._busy

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` on a thread of this pool, in turn (priority 0)."""
        return await self.run_ranked(0.0, fn, *args, **kwargs)

    async def run_ranked(
        self, priority: float, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`fn(*args, **kwargs)` on a thread of this pool, once one is free and no job of
        lower `priority` waits. Cancelled while it runs, the call goes on in its thread (a
        thread cannot be stopped) and keeps its thread until it returns; the caller's own
        stop flag ends it sooner (audio/decode.py `UploadDecoder.stop`)."""
        loop = asyncio.get_running_loop()
        await self._turn(loop, priority)
        try:
            call = partial(contextvars.copy_context().run, partial(fn, *args, **kwargs))
            future: Future[T] = self._executor.submit(call)
        except BaseException:
            self._end(loop)
            raise
        future.add_done_callback(lambda _: self._ended_in_thread(loop))
        return await asyncio.wrap_future(future, loop=loop)

    def shutdown(self) -> None:
        """No new jobs; queued ones are dropped, running ones end in their threads."""
        for *_, waiter in self._waiting:
            if not waiter.done():
                waiter.cancel()
        self._waiting.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _turn(self, loop: asyncio.AbstractEventLoop, priority: float) -> None:
        if self._busy < self.workers and not self.queued:
            self._busy += 1
            return
        waiter: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._waiting, (priority, next(self._order), waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # given the thread, then cancelled
                self._end(loop)
            raise

    def _ended_in_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.call_soon_threadsafe(self._end, loop)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _end(self, loop: asyncio.AbstractEventLoop) -> None:
        self._busy -= 1
        while self._waiting:
            *_, waiter = heapq.heappop(self._waiting)
            if not waiter.done():
                self._busy += 1
                waiter.set_result(None)
                return


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True, slots=True)
class WorkPools:
    """The runtime's pools (created with it, shut down by `Runtime.close`). Sizes: decoding
    uploads takes at most half the cores (one of two), so model calls and live streams keep
    the rest; encoding is short per chunk; file I/O mostly waits on the disk."""

    decode: WorkPool
    encode: WorkPool
    files: WorkPool

    @classmethod
    def for_this_machine(cls) -> WorkPools:
        cores = _cores()
        return cls(
            decode=WorkPool("decode", min(4, max(1, cores // 2))),
            encode=WorkPool("encode", min(8, max(2, cores))),
            files=WorkPool("files", 4),
        )

    def shutdown(self) -> None:
        for pool in (self.decode, self.encode, self.files):
            pool.shutdown()

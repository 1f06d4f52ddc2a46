"""Single flight: concurrent requests for one missing reply share one synthesis.

The synthesis runs as its own task (owned by `Flights`) and appends chunks to a list that
every requester reads at its own pace, from the first chunk: a late joiner replays what was
made, then follows live, so every requester gets the same chunks a lone miss would. When the
last requester leaves, the task is cancelled and nothing is cached; when it fails, every
requester gets the error and nothing is cached; only a complete reply is handed to
`on_done` (the cache).

Bounds: the producer runs at most `lead` chunks ahead of the fastest reader (as the engine
used to be pulled chunk by chunk, a reader that stops makes the engine stop), and a reply
that outgrows `max_bytes` (it will not be cached) stops taking new joiners and drops the
chunks every reader has passed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable

from voxserve.audio.pcm import Int16Array
from voxserve.cache.key import CacheKey
from voxserve.errors import ErrorCode, VoxError

log = logging.getLogger(__name__)

LEAD_CHUNKS = 8
"""Chunks (of at most tts.max_chunk_ms: 1.6 s of audio by default) the synthesis may run
ahead of its fastest reader."""


class Flight:
    """One synthesis in progress, shared by every request for its key."""

    def __init__(self, key: CacheKey, *, max_bytes: int, lead: int = LEAD_CHUNKS) -> None:
        self.key = key
        self.max_bytes = max_bytes
        self.lead = lead
        self.cacheable = True  # false once too big, or invalidated while in progress
        self.done = False
        self.error: VoxError | None = None
        self.nbytes = 0
        self._chunks: list[Int16Array] = []
        self._base = 0  # index of _chunks[0] among every chunk made (after trimming)
        self._readers: dict[int, int] = {}  # reader id -> chunks it has taken
        self._next_reader = 0
        self._produced = asyncio.Event()  # replaced at each wake-up: no lost notifications
        self._taken = asyncio.Event()
        self.on_abandoned: Callable[[Flight], None] | None = None
        self.on_uncacheable: Callable[[Flight], None] | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def made(self) -> int:
        return self._base + len(self._chunks)

    @property
    def readers(self) -> int:
        return len(self._readers)

    # -- the producer --------------------------------------------------------------------

    async def push(self, chunk: Int16Array) -> None:
        """Add a chunk; waits while the fastest reader is `lead` chunks behind."""
        while self._readers and self.made - max(self._readers.values()) >= self.lead:
            await self._taken.wait()
        self._chunks.append(chunk)
        self.nbytes += chunk.nbytes
        if self.cacheable and self.nbytes > self.max_bytes:
            self.mark_uncacheable()
        if not self.cacheable:
            self._trim()
        self._wake_readers()

    def finish(self) -> None:
        self.done = True
        self._wake_readers()

    def fail(self, error: VoxError) -> None:
        self.error = error
        self.done = True
        self._wake_readers()

    def mark_uncacheable(self) -> None:
        if self.cacheable:
            self.cacheable = False
            if self.on_uncacheable is not None:
                self.on_uncacheable(self)

    def pcm(self) -> bytes:
        """The whole reply as little-endian PCM16 (only while nothing was trimmed)."""
        assert self._base == 0
        return b"".join(chunk.astype("<i2", copy=False).tobytes() for chunk in self._chunks)

    def _trim(self) -> None:
        if not self._readers:
            return
        drop = min(self._readers.values()) - self._base
        if drop > 0:
            del self._chunks[:drop]
            self._base += drop

    def _wake_readers(self) -> None:
        event, self._produced = self._produced, asyncio.Event()
        event.set()

    # -- the readers ---------------------------------------------------------------------

    def join(self) -> AsyncGenerator[Int16Array, None]:
        """Register a reader now (so the synthesis knows it is wanted) and return its chunks,
        from the first. Close the iterator to leave."""
        reader = self._next_reader
        self._next_reader += 1
        self._readers[reader] = self._base
        return self._read(reader)

    async def _read(self, reader: int) -> AsyncGenerator[Int16Array, None]:
        try:
            while True:
                at = self._readers[reader] - self._base
                if at < len(self._chunks):
                    self._readers[reader] += 1
                    event, self._taken = self._taken, asyncio.Event()
                    event.set()
                    yield self._chunks[at]
                    continue
                if self.error is not None:
                    err = self.error
                    raise VoxError(err.code, err.message, stage=err.stage)
                if self.done:
                    return
                await self._produced.wait()
        finally:
            self._leave(reader)

    def _leave(self, reader: int) -> None:
        self._readers.pop(reader, None)
        if not self._readers and not self.done:
            if self.on_abandoned is not None:
                self.on_abandoned(self)
            if self.task is not None:
                self.task.cancel()  # nobody wants it: stop the engine, cache nothing


Produce = Callable[[Flight], Awaitable[None]]


class Flights:
    """The syntheses in progress, by key; owns their tasks."""

    def __init__(self) -> None:
        self._by_key: dict[str, Flight] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: CacheKey) -> Flight | None:
        return self._by_key.get(key.digest)

    def in_progress(self) -> list[Flight]:
        return list(self._by_key.values())

    def start(
        self,
        key: CacheKey,
        produce: Produce,
        on_done: Callable[[Flight], None],
        *,
        max_bytes: int,
    ) -> Flight:
        """A new flight for `key`, its synthesis started as a task; join it at once."""
        flight = Flight(key, max_bytes=max_bytes)
        flight.on_abandoned = self._forget
        flight.on_uncacheable = self._forget  # new requests start afresh: this one trims
        self._by_key[key.digest] = flight
        task = asyncio.create_task(self._run(flight, produce, on_done), name="voxserve-tts-flight")
        flight.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return flight

    def _forget(self, flight: Flight) -> None:
        if self._by_key.get(flight.key.digest) is flight:
            del self._by_key[flight.key.digest]

    async def _run(
        self, flight: Flight, produce: Produce, on_done: Callable[[Flight], None]
    ) -> None:
        try:
            await produce(flight)
        except asyncio.CancelledError:
            # Abandoned (no reader is left) or the server is stopping: any reader still
            # there gets an error, never a silent end that would look like a whole reply.
            flight.fail(VoxError(ErrorCode.ENGINE_ERROR, "synthesis was cancelled", stage="tts"))
            raise
        except VoxError as exc:
            flight.fail(exc)
        except Exception as exc:  # a bug: every reader gets an error, the log says which
            log.exception("tts synthesis failed")
            flight.fail(VoxError(ErrorCode.INTERNAL, f"synthesis failed ({type(exc).__name__})"))
        else:
            flight.finish()
            if flight.cacheable:
                on_done(flight)
        finally:
            self._forget(flight)

    async def aclose(self) -> None:
        """Cancel every synthesis in progress and wait for them to end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._by_key.clear()

"""What a session sends back, in order, through one bounded queue drained by the transport.

Bounded (settings.pipeline.outbox_messages) so a client that stops reading makes the
pipeline wait instead of growing server memory. Events stay typed values here
(voxserve/events.py); each transport encodes them for its wire (JSON on the WebSocket,
messages on gRPC) as it sends them.
"""

from __future__ import annotations

import asyncio

from voxserve.errors import ErrorCode, VoxError
from voxserve.events import ServerEvent

Outgoing = ServerEvent | bytes


class Outbox:
    """`stall_s`: how long a put may wait for the client to read before the client counts
    as stalled (`client_stalled`, fatal; `stalled` turns true so the transport can close
    the connection instead of queueing the error behind what the client never read)."""

    def __init__(self, maxsize: int, stall_s: float | None = None) -> None:
        self._queue: asyncio.Queue[Outgoing | None] = asyncio.Queue(maxsize)
        self.stall_s = stall_s
        self.stalled = False
        self.sent_events = 0
        self.sent_audio_bytes = 0

    async def _put(self, item: Outgoing | None) -> None:
        try:
            self._queue.put_nowait(item)  # the common case: no timer
            return
        except asyncio.QueueFull:
            pass
        if self.stall_s is None:
            await self._queue.put(item)
            return
        try:
            async with asyncio.timeout(self.stall_s):
                await self._queue.put(item)
        except TimeoutError:
            self.stalled = True
            raise VoxError(
                ErrorCode.CLIENT_STALLED,
                f"the client read nothing for {self.stall_s:g} s while output waited",
                fatal=True,
            ) from None

    async def event(self, event: ServerEvent) -> None:
        await self._put(event)
        # Counted once queued, so the count numbers the events in queue order: a put that
        # is cancelled or times out queues nothing (realtime_origins reads the numbers).
        self.sent_events += 1

    def event_nowait(self, event: ServerEvent) -> bool:
        """For paths that must not wait (cancellation): False if the client is not reading."""
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            return False
        self.sent_events += 1
        return True

    async def audio(self, pcm: bytes) -> None:
        self.sent_audio_bytes += len(pcm)
        await self._put(pcm)

    async def close(self) -> None:
        """No more output; the drain loop stops after what is queued."""
        await self._put(None)

    def close_nowait(self) -> bool:
        """Close without waiting (cancellation paths); False if the client is not reading."""
        try:
            self._queue.put_nowait(None)
        except asyncio.QueueFull:
            return False
        return True

    async def next(self) -> Outgoing | None:
        return await self._queue.get()

    def qsize(self) -> int:
        return self._queue.qsize()

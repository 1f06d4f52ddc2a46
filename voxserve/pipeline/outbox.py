"""What a session sends back, in order, through one bounded queue drained by the transport.

Bounded (settings.pipeline.outbox_messages) so a client that stops reading makes the
pipeline wait instead of growing server memory. Events stay dicts here; each transport
encodes them for its wire (JSON on the WebSocket, messages on gRPC, ...).
"""

from __future__ import annotations

import asyncio
from typing import Any

Event = dict[str, Any]
Outgoing = Event | bytes


class Outbox:
    def __init__(self, maxsize: int) -> None:
        self._queue: asyncio.Queue[Outgoing | None] = asyncio.Queue(maxsize)
        self.sent_events = 0
        self.sent_audio_bytes = 0

    async def event(self, event: dict[str, Any]) -> None:
        self.sent_events += 1
        await self._queue.put(event)

    def event_nowait(self, event: dict[str, Any]) -> bool:
        """For paths that must not wait (cancellation): False if the client is not reading."""
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            return False
        self.sent_events += 1
        return True

    async def audio(self, pcm: bytes) -> None:
        self.sent_audio_bytes += len(pcm)
        await self._queue.put(pcm)

    async def close(self) -> None:
        """No more output; the drain loop stops after what is queued."""
        await self._queue.put(None)

    async def next(self) -> Outgoing | None:
        return await self._queue.get()

    def qsize(self) -> int:
        return self._queue.qsize()

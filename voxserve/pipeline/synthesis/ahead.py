"""Reply audio synthesised but not yet sent: a bounded hand-off between the synthesis of a
reply and its paced sending (speaker.py).

Bounded by audio length (`tts.max_ahead_ms`), so a reply that is synthesised faster than it
plays waits instead of growing memory; one producer and one consumer, which never wait at
the same time (a full buffer has something to take, an empty one has room), so one event
serves both. Items are audio chunks or events that must go out in order with them.
"""

from __future__ import annotations

import asyncio
from collections import deque

import numpy as np

from voxserve.audio.pcm import Int16Array
from voxserve.events import ServerEvent

AheadItem = Int16Array | ServerEvent


class AudioAhead:
    def __init__(self, max_samples: int) -> None:
        self.max_samples = max_samples
        self.samples = 0  # audio queued now
        self._items: deque[AheadItem] = deque()
        self._finished = False
        self._error: BaseException | None = None
        self._changed = asyncio.Event()

    async def put(self, item: AheadItem) -> None:
        """Queue an item; waits while `max_samples` of audio are already queued."""
        while self.samples >= self.max_samples:
            self._changed.clear()
            await self._changed.wait()
        self._items.append(item)
        if isinstance(item, np.ndarray):
            self.samples += item.size
        self._changed.set()

    def finish(self, error: BaseException | None = None) -> None:
        """No more items; `error` is raised to the consumer after what is queued."""
        self._finished = True
        self._error = error
        self._changed.set()

    async def get(self) -> AheadItem | None:
        """The next item, None at the end; raises the producer's error at the end."""
        while not self._items:
            if self._finished:
                if self._error is not None:
                    raise self._error
                return None
            self._changed.clear()
            await self._changed.wait()
        item = self._items.popleft()
        if isinstance(item, np.ndarray):
            self.samples -= item.size
        self._changed.set()
        return item

"""A tts session's input: the client's text, cut into sentences, queued for the reply turn.

`flush` (or the end of input) ends an utterance: the sentences queued up to it are spoken
as one reply. Marks wait in the queue behind the text sent before them and are echoed once
it has been spoken; a cancel drops the text not yet spoken but still answers its marks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from voxserve.errors import ErrorCode, VoxError
from voxserve.events import Mark
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.turns.replies import Replies
from voxserve.text import SentenceBuffer

TEXT_QUEUE = 64  # sentences waiting for TTS before the receiver waits
_FLUSH = object()  # end of one utterance


class _Mark:
    __slots__ = ("id",)

    def __init__(self, mark_id: str | int) -> None:
        self.id = mark_id


class TextInput:
    """A tts session's text on its way to the reply turn (module docstring)."""

    __slots__ = ("_queue", "_texts", "closed", "draining", "max_chars", "outbox", "replies")

    def __init__(self, outbox: Outbox, replies: Replies, *, max_chars: int) -> None:
        """`max_chars`: the most text that may wait to be cut into sentences."""
        self.outbox = outbox
        self.replies = replies
        self.max_chars = max_chars
        self.closed = False
        self.draining = False  # the server is shutting down: input closed, turn finishing
        self._texts = SentenceBuffer()
        # Sentences, _FLUSH, marks, and None (the end of input), in the client's order.
        self._queue: asyncio.Queue[object] = asyncio.Queue(TEXT_QUEUE)

    async def feed(self, text: str, *, flush: bool = False) -> None:
        """Queue the whole sentences of `text` (the rest waits for more); `flush` ends the
        utterance. Waits while the queue is full."""
        if self.draining:
            raise VoxError(
                ErrorCode.SHUTTING_DOWN, "the server is shutting down; no more text is accepted"
            )
        if self.closed:
            raise VoxError(ErrorCode.INVALID_MESSAGE, "text after the end of input")
        limit = self.max_chars
        if len(text) + len(self._texts) > limit:
            raise VoxError(ErrorCode.TEXT_TOO_LONG, f"pending text would exceed {limit} characters")
        for sentence in self._texts.push(text):
            await self._queue.put(sentence)
        if flush:
            await self._flush()

    async def _flush(self) -> None:
        rest = self._texts.flush()
        if rest:
            await self._queue.put(rest)
        await self._queue.put(_FLUSH)

    async def mark(self, mark_id: str | int) -> None:
        """Echoed once the text sent before it has been spoken."""
        await self._queue.put(_Mark(mark_id))

    async def clear(self) -> None:
        """Client barge-in: forget text not yet spoken (marks are answered, never lost)."""
        self._texts.clear()
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, _Mark):
                await self.outbox.event(Mark(id=item.id))
            if item is None:  # keep the end-of-input marker
                await self._queue.put(None)
                break

    def stop(self, *, draining: bool) -> None:
        """No more text: refused as after the end of input, or as the server shuts down."""
        if draining:
            self.draining = True
        else:
            self.closed = True

    async def end(self) -> None:
        """After `stop`: the text still waiting is the last utterance; then the end."""
        await self._flush()
        await self._queue.put(None)

    async def run(self) -> None:
        """Speak the utterances in order, one reply each, until the end of input."""
        reply = 0
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if item is _FLUSH:
                continue
            if isinstance(item, _Mark):
                await self.outbox.event(Mark(id=item.id))
                continue
            await self.replies.speak(self._utterance(str(item)), reply)
            reply += 1

    async def _utterance(self, first: str) -> AsyncIterator[str]:
        """The sentences of one utterance, from `first` to its flush (marks on the way are
        echoed as they come)."""
        yield first
        while True:
            item = await self._queue.get()
            if item is _FLUSH:
                return
            if item is None:  # end of input also ends the utterance
                await self._queue.put(None)
                return
            if isinstance(item, _Mark):
                await self.outbox.event(Mark(id=item.id))
                continue
            yield str(item)

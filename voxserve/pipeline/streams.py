"""Async streams the pipeline reads (a responder's, a synthesis's): closing one, reading a
responder's within its time limit, and its text cut into sentences for the speaker.

Replies (/v1/stream) and a conversation's responses read their responder the same way:
one deadline over the whole answer, its time to first output observed as the `responder`
stage, turn marks around it, the stream closed however the reading ends, and the text
handed to the speaker a sentence at a time. Written once here so the two cannot drift apart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from voxserve.errors import ErrorCode, VoxError
from voxserve.observe.metrics import Metrics
from voxserve.observe.tracing import TurnMarks
from voxserve.text import SentenceBuffer

T = TypeVar("T")


async def aclose(stream: object) -> None:
    """Stop `stream` now (between chunks; also when the client cancelled) if it can be
    closed: an async generator's `finally` blocks run here, not at garbage collection."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


async def read_responder(
    open_stream: Callable[[], AsyncIterator[T]],
    each: Callable[[T], Awaitable[None]],
    *,
    limit: float,
    metrics: Metrics,
    turn: TurnMarks | None,
) -> None:
    """Open the responder's stream and hand `each` every piece, within `limit` seconds for
    the whole of it (else VoxError STAGE_TIMEOUT, stage `responder`). The time to its first
    piece is the `responder` stage's; `turn` (tracing on) gets responder.start and, when
    the stream has ended, responder.end. The stream is closed however this ends."""
    asked = time.perf_counter()
    if turn is not None:
        turn.mark("responder.start")
    stream = open_stream()
    first = True
    try:
        async with asyncio.timeout(limit):
            async for piece in stream:
                if first:  # the responder's time to its first output
                    first = False
                    metrics.observe_stage("responder", "live", time.perf_counter() - asked)
                await each(piece)
    except TimeoutError:
        raise VoxError(
            ErrorCode.STAGE_TIMEOUT,
            f"responder did not finish within {limit:g} s",
            stage="responder",
        ) from None
    finally:
        await aclose(stream)
    if turn is not None:
        turn.mark("responder.end")


class SpokenSentences:
    """A reply's text cut into sentences as it streams, for its Speaker to read (`read`):
    four sentences at most wait, so a responder faster than speech waits for the speaker."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str | None] = asyncio.Queue(4)
        self._buffer = SentenceBuffer()

    async def push(self, text: str) -> None:
        """A piece of the text: its whole sentences go to the speaker."""
        for sentence in self._buffer.push(text):
            await self._queue.put(sentence)

    async def end(self) -> None:
        """The text is complete: the rest is the last sentence, then `read` ends."""
        rest = self._buffer.flush()
        if rest:
            await self._queue.put(rest)
        await self._queue.put(None)

    async def read(self) -> AsyncIterator[str]:
        while (sentence := await self._queue.get()) is not None:
            yield sentence

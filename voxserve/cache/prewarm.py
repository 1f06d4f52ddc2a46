"""Prewarming: fill the cache with known sentences before anyone asks for them.

One sentence at a time, through the normal synthesis path (so the entries are exactly what a
request would cache); the function that makes one (pipeline/synthesis/synthesize.py) only takes a
TTS slot when the stage has one to spare, so live requests never queue behind a prewarm.
Progress is counted on the cache (stats, metrics) and reported to an optional callback.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from voxserve.cache.tts_cache import TtsCache
from voxserve.errors import VoxError
from voxserve.text import sentences

log = logging.getLogger(__name__)

MAX_PENDING = 10_000
"""Sentences waiting to be prewarmed; a request that would queue more is refused (at ~0.2 s
of synthesis each, 10,000 is already half an hour of idle TTS time)."""


@dataclass(frozen=True, slots=True)
class PrewarmItem:
    text: str
    voice: str | None = None  # None: the default voice
    speed: float = 1.0
    sample_rate: int | None = None  # None: tts.output_sample_rate


MakeOne = Callable[[PrewarmItem], Awaitable[bool]]
"""Caches one item; True if it was synthesised, False if it was already cached."""


def expand(lines: Iterable[str]) -> list[str]:
    """The texts to cache for some lines: each line whole (what HTTP speech looks up), and
    its sentences too when it has several (what a WebSocket reply looks up, sentence by
    sentence). Blank lines and `#` comments are skipped; duplicates are dropped."""
    texts: dict[str, None] = {}
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        texts[line] = None
        parts = sentences(line)
        if len(parts) > 1:
            texts.update(dict.fromkeys(parts))
    return list(texts)


def read_sentences(path: Path) -> list[str]:
    """The texts a prewarm file asks for (UTF-8, one sentence or reply a line)."""
    return expand(path.read_text(encoding="utf-8").splitlines())


class Prewarmer:
    def __init__(
        self,
        cache: TtsCache,
        make_one: MakeOne,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.cache = cache
        self.make_one = make_one
        self.on_progress = on_progress
        self._pending: deque[PrewarmItem] = deque()
        self._task: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def submit(self, items: list[PrewarmItem]) -> int:
        """Queue items behind those already waiting; returns the new progress total.
        Raises ValueError when the queue would exceed MAX_PENDING."""
        if len(self._pending) + len(items) > MAX_PENDING:
            raise ValueError(
                f"{len(items)} sentences would exceed the prewarm queue of {MAX_PENDING} "
                f"({len(self._pending)} waiting); send fewer at a time"
            )
        self._pending.extend(items)
        self.cache.prewarm_total += len(items)
        if items and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._work(), name="voxserve-prewarm")
        return self.cache.prewarm_total

    async def wait(self) -> None:
        """Until everything submitted so far is done (start-up, tests)."""
        while self._task is not None and not self._task.done():
            await asyncio.wait([self._task])

    async def _work(self) -> None:
        cache = self.cache
        while self._pending:
            item = self._pending.popleft()
            try:
                await self.make_one(item)
            except VoxError as exc:
                cache.prewarm_failed += 1
                log.warning("prewarm sentence failed", extra={"error": exc.code.value})
            cache.prewarm_done += 1
            if self.on_progress is not None:
                self.on_progress(cache.prewarm_done, cache.prewarm_total)
            await asyncio.sleep(0)  # let the loop serve requests between sentences

    async def aclose(self) -> None:
        self._pending.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

"""Recent audio of one stream, addressed by absolute sample position.

Chunks are kept as they arrive (one per pipeline wake-up) and joined only when an utterance
or a partial needs them, so appending costs nothing per frame.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from voxserve.audio.pcm import Int16Array


class StreamAudio:
    def __init__(self) -> None:
        self._chunks: deque[tuple[int, Int16Array]] = deque()  # (start position, samples)
        self.end = 0  # position after the last sample appended

    @property
    def start(self) -> int:
        return self._chunks[0][0] if self._chunks else self.end

    def append(self, samples: Int16Array) -> None:
        if samples.size:
            self._chunks.append((self.end, samples))
            self.end += int(samples.size)

    def slice(self, begin: int, stop: int) -> Int16Array:
        """Samples in [begin, stop), clamped to what is held."""
        begin, stop = max(begin, self.start), min(stop, self.end)
        parts = []
        for pos, chunk in self._chunks:
            if pos + chunk.size <= begin:
                continue
            if pos >= stop:
                break
            parts.append(chunk[max(0, begin - pos) : stop - pos])
        if not parts:
            return np.zeros(0, dtype=np.int16)
        return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)

    def trim(self, before: int) -> None:
        """Forget whole chunks that end at or before `before`."""
        chunks = self._chunks
        while chunks and chunks[0][0] + chunks[0][1].size <= before:
            chunks.popleft()

    @property
    def held_samples(self) -> int:
        return self.end - self.start

"""Streamed text to speakable pieces: TTS starts on the first complete sentence, not the last."""

from __future__ import annotations

import re

# A sentence ends at . ! ? (or CJK equivalents) followed by whitespace; the lookbehind skips
# common abbreviations so "Dr. Smith" is not cut.
_SENTENCE_END = re.compile(
    r"(?<!\bMr)(?<!\bMrs)(?<!\bDr)(?<!\bSt)(?<!\be\.g)(?<!\bi\.e)[.!?;]+[\"')\]]*\s+|[。！？；]"
)


def split_sentences(text: str) -> tuple[list[str], str]:
    """Complete sentences found in `text`, and the unfinished rest."""
    pieces: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        piece = text[start : match.end()].strip()
        if piece:
            pieces.append(piece)
        start = match.end()
    return pieces, text[start:]


class SentenceBuffer:
    """Accumulates text pieces as they stream in and releases whole sentences."""

    def __init__(self) -> None:
        self._pending = ""

    def __len__(self) -> int:
        return len(self._pending)

    def push(self, text: str) -> list[str]:
        sentences, self._pending = split_sentences(self._pending + text)
        return sentences

    def flush(self) -> str | None:
        rest, self._pending = self._pending.strip(), ""
        return rest or None

    def clear(self) -> None:
        self._pending = ""

"""Where text may be cut for speech: the one definition of sentence and clause ends, used by
every splitter that feeds TTS (the session's sentence buffer, the piper and espeak engines,
the rules and LLM responders).

TTS starts on the first complete piece, not the last, so text is cut as early as it can be
without clipping words: a sentence ends at . ! ? … (then any closing quotes or brackets)
followed by white space, never after a title or abbreviation ("Dr. Smith"); CJK full stops
need no space after them. Requiring the space keeps "3.5" whole while it streams in.

No engine is given more than MAX_PIECE_CHARS characters at once (`bounded_pieces`): a
sentence longer than that is cut at its clause ends, then between words, then anywhere, so
text with no punctuation (or one 4,000-character "word") costs the engine bounded work.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

MAX_PIECE_CHARS = 200
"""The longest piece of text an engine is given at once. Engines synthesise a piece in one
go (espeak one call; piper one phonemisation, then model calls of bounded length), so this
bounds the work, memory and audio of one step, and how long a cancelled request runs on.
200 characters is two long clauses of prose, about 12 s of speech."""

_CLOSERS = "\"'”’)\\]"
_ABBREVIATION = re.compile(r"\b(?:mr|mrs|ms|dr|prof|st|sr|jr|vs|etc|e\.g|i\.e)$", re.IGNORECASE)
_FULL_STOP_AND_SPACE = re.compile(r"\.\s+")  # the only ending an abbreviation can take
_LONGEST_ABBREVIATION = 5  # characters looked back over: "prof" and the one before it


def _end_pattern(stops: str, cjk_stops: str, *others: str) -> re.Pattern[str]:
    """Stops then closers then white space, or CJK stops (no space needed), or `others`."""
    return re.compile(
        "|".join((rf"[{stops}]+[{_CLOSERS}]*\s+", rf"[{cjk_stops}]+[{_CLOSERS}]*\s*", *others))
    )


_SENTENCE_END = _end_pattern(".!?…", "。！？")
# A semicolon joins two independent clauses; streamed text is cut there too, so TTS can
# start on the first before the full stop arrives.
_STREAMED_SENTENCE_END = _end_pattern(".!?…;", "。！？；")
# LLM replies put list items and headings on lines of their own.
_SENTENCE_OR_LINE_END = _end_pattern(".!?…", "。！？", r"\n+")
# A clause ends at , ; : followed by white space, or at a dash used as punctuation: an em or
# en dash (spaced or not; not yet at the end of streamed text) or a hyphen between spaces.
_CLAUSE_END = re.compile(r"(?<=[,;:])\s+|\s*[—–](?:\s+|(?=\S))|\s+-\s+")
# "1. " or "a) " on its own: the start of a list item, not a sentence.
_LIST_MARKER = re.compile(r"\s*(?:\d{1,3}|[A-Za-z])[.)]\s*")


def _ends(pattern: re.Pattern[str], text: str, start: int = 0) -> Iterator[int]:
    """Offsets just past each end `pattern` finds from `start` (past the white space after
    it), skipping a full stop that closes an abbreviation."""
    for match in pattern.finditer(text, start):
        if _FULL_STOP_AND_SPACE.fullmatch(match.group()) and _ABBREVIATION.search(
            text, max(0, match.start() - _LONGEST_ABBREVIATION), match.start()
        ):
            continue
        yield match.end()


def split_sentences(text: str) -> tuple[list[str], str]:
    """Complete sentences found in streamed `text` (stripped), and the unfinished rest."""
    pieces: list[str] = []
    start = 0
    for end in _ends(_STREAMED_SENTENCE_END, text):
        piece = text[start:end].strip()
        if piece:
            pieces.append(piece)
        start = end
    return pieces, text[start:]


def sentence_pieces(text: str) -> list[str]:
    """Every sentence of a whole text as written, the white space after it included, so the
    pieces join back to `text` (unless it is only white space: no pieces)."""
    pieces: list[str] = []
    start = 0
    for end in _ends(_SENTENCE_END, text):
        pieces.append(text[start:end])
        start = end
    if text[start:].strip():  # an end takes the white space after it: the rest has words
        pieces.append(text[start:])
    return pieces


def sentences(text: str) -> list[str]:
    """Every sentence of a whole text, stripped; the last may lack its full stop."""
    return [piece.strip() for piece in sentence_pieces(text) if piece.strip()]


def split_clauses(sentence: str, min_chars: int) -> list[str]:
    """Clauses of one sentence; pieces shorter than `min_chars` join a neighbour.

    Very short pieces ("Well," or "Yes, ...") sound clipped on their own, and each piece costs
    a model call, so only reasonably sized clauses are synthesised separately.
    """
    pieces: list[str] = []
    pos = 0
    for match in _CLAUSE_END.finditer(sentence):
        pieces.append(_clause(sentence[pos : match.start()], match))
        pos = match.end()
    pieces.append(sentence[pos:].strip())
    pieces = [p for p in pieces if p and p != ","]

    merged: list[str] = []
    for piece in pieces:
        if merged and len(merged[-1]) < min_chars:
            merged[-1] = f"{merged[-1]} {piece}"
        else:
            merged.append(piece)
    if len(merged) > 1 and len(merged[-1]) < min_chars:
        last = merged.pop()
        merged[-1] = f"{merged[-1]} {last}"
    return merged


def _clause(text: str, end: re.Match[str]) -> str:
    """A clause's text before its `end` (a _CLAUSE_END match): a dash is a pause, so the
    clause ends with a comma for the voice to hear it as one."""
    if "—" in end.group() or "–" in end.group() or "-" in end.group():
        text += ","
    return text.strip()


def split_first_clause(piece: str, min_first: int, min_rest: int) -> list[str]:
    """`piece` cut at its first clause end (`, ; :` or a dash) with at least `min_first`
    characters before it and `min_rest` after; `[piece]` where there is none."""
    for match in _CLAUSE_END.finditer(piece):
        head, rest = piece[: match.start()].strip(), piece[match.end() :].strip()
        if len(head) < min_first:
            continue
        if len(rest) < min_rest:
            break
        return [_clause(head, match), rest]
    return [piece]


def bounded_pieces(text: str, max_chars: int = MAX_PIECE_CHARS) -> list[str]:
    """Every sentence of `text`, each cut (`cut_to_length`) into pieces of at most
    `max_chars` characters: what an engine is given at once, whatever the text."""
    return [part for sentence in sentences(text) for part in cut_to_length(sentence, max_chars)]


def cut_to_length(text: str, max_chars: int = MAX_PIECE_CHARS) -> list[str]:
    """`text` (stripped) in pieces of at most `max_chars` characters, each stripped: cut at
    the last clause end that fits, else at the last white space, else hard (not before a
    combining mark when avoidable). Joined with spaces, the pieces hold every character of
    `text` but the white space at the cuts."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    pieces: list[str] = []
    rest = text.strip()
    while len(rest) > max_chars:
        cut = _last_cut(rest, max_chars)
        pieces.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest:
        pieces.append(rest)
    return pieces


def _last_cut(text: str, max_chars: int) -> int:
    """Where to end the first piece of stripped `text` (longer than `max_chars`)."""
    clause_end = 0
    for match in _CLAUSE_END.finditer(text, 1, max_chars + 1):
        if len(text[: match.end()].rstrip()) <= max_chars:
            clause_end = match.end()
    if clause_end:
        return clause_end
    for at in range(max_chars, 0, -1):  # the white space nearest the limit
        if text[at].isspace():
            return at
    at = max_chars
    # A combining mark belongs to the character before it: move it to the next piece whole,
    # unless the run of marks fills half the piece (hostile text, not a script).
    while at > max_chars // 2 and unicodedata.category(text[at])[0] == "M":
        at -= 1
    return at if at > max_chars // 2 else max_chars


class SentenceBuffer:
    """Accumulates text pieces as they stream in and releases whole sentences."""

    def __init__(self) -> None:
        self._pending = ""

    def __len__(self) -> int:
        return len(self._pending)

    def push(self, text: str) -> list[str]:
        complete, self._pending = split_sentences(self._pending + text)
        return complete

    def flush(self) -> str | None:
        rest, self._pending = self._pending.strip(), ""
        return rest or None

    def clear(self) -> None:
        self._pending = ""


class ClauseBuffer:
    """Regroups streamed text into sentence/clause chunks.

    Chunks are exact consecutive substrings of the input (trailing whitespace included), so
    joining them gives back the text. A sentence or line end always cuts; a clause end cuts
    once the chunk has `min_clause_chars`; with no boundary, a chunk is cut at a space once
    it reaches `max_chunk_chars`, so a run-on reply cannot stall TTS.
    """

    def __init__(self, *, min_clause_chars: int = 24, max_chunk_chars: int = 200) -> None:
        self.min_clause_chars = min_clause_chars
        self.max_chunk_chars = max(1, max_chunk_chars)
        self._buf = ""

    def feed(self, piece: str) -> list[str]:
        """Add streamed text; return the chunks it completed (often none)."""
        self._buf += piece
        chunks: list[str] = []
        while (cut := self._find_cut()) is not None:
            chunks.append(self._buf[:cut])
            self._buf = self._buf[cut:]
        return chunks

    def flush(self) -> str:
        """Whatever is left at the end of the stream ("" if only whitespace)."""
        rest, self._buf = self._buf, ""
        return rest if rest.strip() else ""

    def _find_cut(self) -> int | None:
        buf = self._buf
        start = len(buf) - len(buf.lstrip())
        best: int | None = None
        for end in _ends(_SENTENCE_OR_LINE_END, buf, start):
            if not _LIST_MARKER.fullmatch(buf[:end]):  # "1. " is not a sentence
                best = end
                break
        for match in _CLAUSE_END.finditer(buf, start):
            if best is not None and match.end() >= best:
                break
            if match.end() - start >= self.min_clause_chars:
                best = match.end()
                break
        if best is None and len(buf) - start >= self.max_chunk_chars:
            limit = start + self.max_chunk_chars
            space = buf.rfind(" ", start, limit)
            best = space + 1 if space > start else limit
        return best

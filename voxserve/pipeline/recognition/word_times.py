"""Word times clipped to the speech the VAD heard.

Whisper's alignment (engines/whisper_words.py) makes words contiguous: a word ends where the
next starts, the first starts where the decoder's path does and the last ends at its
end-of-text token. So a word before or after a silence takes the silence in ("joke." timed
1.26-3.22 s where speech ended at 1.44 s; "Please" from 0.0 s over 0.3 s of leading
silence). The VAD's speech spans (no padding) bound them: a word keeps the part of its time
inside the spans it overlaps, from the first such span's start to the last one's end. A word
that overlaps no span (speech too quiet for the VAD) keeps the aligner's time.

Bounds: a span starts with the first VAD window over `vad.threshold`, moved one window (32
ms) earlier for a soft onset, and ends where the VAD's probability falls under
`vad.neg_threshold`, which silero reaches 30-130 ms after the last audible sound.

Pure: a result and spans in, a result out.
"""

from __future__ import annotations

from dataclasses import replace

from voxserve.types import AsrResult, Segment, Word

Span = tuple[int, int]  # ms on the recording's time line, in order, not overlapping


def clip_to_speech(result: AsrResult, spans: list[Span]) -> AsrResult:
    """`result` with every word's time clipped to the speech spans it overlaps (module
    docstring), and each segment's start and end moved in to its first and last word."""
    if not spans or not any(segment.words for segment in result.segments):
        return result
    return replace(result, segments=tuple(_segment(s, spans) for s in result.segments))


def _segment(segment: Segment, spans: list[Span]) -> Segment:
    if not segment.words:
        return segment
    words = tuple(_word(word, spans) for word in segment.words)
    start = max(segment.start_ms, words[0].start_ms)
    end = max(start, min(segment.end_ms, words[-1].end_ms))
    return replace(segment, start_ms=start, end_ms=end, words=words)


def _word(word: Word, spans: list[Span]) -> Word:
    inside = [(a, b) for a, b in spans if a < word.end_ms and b > word.start_ms]
    if not inside:
        return word
    start = max(word.start_ms, inside[0][0])
    end = max(start, min(word.end_ms, inside[-1][1]))
    return replace(word, start_ms=start, end_ms=end)

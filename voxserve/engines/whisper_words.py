"""Word timestamps for Whisper: CTranslate2's cross-attention alignment (`align`, dynamic
time warping over the alignment heads), cut into words, as faster-whisper and openai-whisper
time words.

Whisper's encoder frames are 20 ms (two 10 ms mel frames). `align` maps every text token to
a frame; a word starts at its first token's frame and ends where the next word starts, so
words are contiguous and in order. Punctuation is folded into the word beside it (OpenAI's
words carry no lone punctuation). Its cost is one extra decoder pass over the text, paid only
when a request asks for word timestamps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from faster_whisper.tokenizer import Tokenizer

from voxserve.types import Word

SECONDS_PER_TOKEN = 0.02  # one encoder frame: 2 mel frames of 10 ms
MEDIAN_FILTER_WIDTH = 7
PREPENDED = "\"'“¿([{-"
APPENDED = "\"'.。,，!！?？:：”)]}、"


@dataclass(slots=True)
class WordTiming:
    """A word as aligned: its text (leading space kept), token ids, times (s), mean prob."""

    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


def align_words(
    model: Any,
    tokenizer: Tokenizer,
    encoder_output: Any,
    text_tokens: list[int],
    num_frames: int,
) -> list[WordTiming]:
    """Words of `text_tokens` (no special tokens) timed against one row of encoder output
    (a [1, frames, dim] StorageView); `num_frames` is the audio's length in mel frames."""
    if not text_tokens:
        return []
    result = model.align(
        encoder_output,
        tokenizer.sot_sequence,
        [text_tokens],
        num_frames,
        median_filter_width=MEDIAN_FILTER_WIDTH,
    )[0]
    words, word_tokens = tokenizer.split_to_word_tokens([*text_tokens, tokenizer.eot])
    if len(word_tokens) <= 1:
        return []
    pairs = np.asarray(result.alignments, dtype=np.int64).reshape(-1, 2)
    text_indices, time_indices = pairs[:, 0], pairs[:, 1]
    # The frame where each token's path first arrives (the DTW path steps token by token).
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] * SECONDS_PER_TOKEN
    bounds = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    probs = np.asarray(result.text_token_probs, dtype=np.float64)
    timings: list[WordTiming] = []
    for k, (word, tokens) in enumerate(zip(words[:-1], word_tokens[:-1], strict=True)):
        i, j = int(bounds[k]), int(bounds[k + 1])
        if j >= jump_times.size:
            break
        timings.append(
            WordTiming(
                word=word,
                tokens=list(tokens),
                start=float(jump_times[i]),
                end=float(jump_times[j]),
                probability=float(np.mean(probs[i:j])) if j > i else 0.0,
            )
        )
    _merge_punctuation(timings)
    return [t for t in timings if t.word]


def _merge_punctuation(timings: list[WordTiming]) -> None:
    """Fold opening punctuation into the next word and closing into the previous one."""
    following = len(timings) - 1
    for i in range(len(timings) - 2, -1, -1):
        before, after = timings[i], timings[following]
        if before.word.startswith(" ") and before.word.strip() in PREPENDED:
            after.word = before.word + after.word
            after.tokens = before.tokens + after.tokens
            after.start = before.start
            before.word, before.tokens = "", []
        else:
            following = i
    previous = 0
    for j in range(1, len(timings)):
        before, after = timings[previous], timings[j]
        if before.word and not before.word.endswith(" ") and after.word in APPENDED:
            before.word += after.word
            before.tokens = before.tokens + after.tokens
            before.end = after.end
            after.word, after.tokens = "", []
        else:
            previous = j


def words_of_runs(
    timings: list[WordTiming], run_lengths: list[int], end_s: float
) -> list[tuple[Word, ...]]:
    """The words of each run of text tokens (a segment), by their token counts, in ms and
    clipped to the audio's end; times never go backwards."""
    out: list[tuple[Word, ...]] = []
    index = 0
    last_ms = 0
    end_ms = round(end_s * 1000)
    for length in run_lengths:
        words: list[Word] = []
        used = 0
        while index < len(timings) and used < length:
            timing = timings[index]
            start = min(max(round(timing.start * 1000), last_ms), end_ms)
            end = min(max(round(timing.end * 1000), start), end_ms)
            words.append(Word(timing.word, start, end, round(timing.probability, 4)))
            last_ms = end
            used += len(timing.tokens)
            index += 1
        out.append(tuple(words))
    return out

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from faster_whisper.tokenizer import Tokenizer

from voxserve.types import Word

TIMESTAMPS = 1501  # <|0.00|> ... <|30.00|>, after every other token id
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


def stop_tokens(tokenizer: Tokenizer) -> npt.NDArray[np.bool_]:
    """Per token id, whether writing it stops the words: punctuation or space only, the end
    of text, a timestamp or any other special token. Once per model (~50k decodes)."""
    inner = tokenizer.tokenizer
    # every id the model may write: the vocabulary, then 1501 timestamps (0.00 to 30.00 s)
    size = max(inner.get_vocab_size(), tokenizer.timestamp_begin + TIMESTAMPS)
    texts = inner.decode_batch([[i] for i in range(tokenizer.eot)])
    stops = np.ones(size, dtype=np.bool_)
    stops[: tokenizer.eot] = [not any(ch.isalnum() for ch in text) for text in texts]
    return stops


def stop_before_last_word(
    tokens: Sequence[int],
    step_logits: Sequence[Any],
    tokenizer: Tokenizer,
    stops: npt.NDArray[np.bool_],
) -> float | None:
    """The probability the decoder gave to stopping (`stop_tokens`) where it wrote the text's
    last word instead: from that step's log-probabilities (`generate(...,
    return_logits_vocab=True)`, one row per generated token). None without a word.

    Why: Whisper ends a phrase cut at a pause with a word that is not there ("Can you book a
    table for it?" for "... table for [pause] four people"), which reads as a whole question.
    tiny.en weighed stopping there at 0.28-0.46 at every cut from the VAD's end to 200 ms
    past it, and at 0.00-0.06 before the spoken last words of the fixtures (0.41 before a
    sentence-final "please": endpointing.py reads it only after a word that continues)."""
    eot = tokenizer.eot
    positions = [i for i, t in enumerate(tokens) if t < eot and i < len(step_logits)]
    while positions and stops[tokens[positions[-1]]]:
        positions.pop()  # trailing punctuation: "?", "."
    first: int | None = None
    while positions:
        first = positions.pop()
        if tokenizer.decode([tokens[first]]).startswith(" "):
            break
    if first is None:
        return None
    row = np.asarray(step_logits[first], dtype=np.float32).reshape(-1)
    weights = np.exp(row - row.max())
    return float(weights[stops[: row.size]].sum() / weights.sum())

"""The arithmetic of a report: nearest-rank percentiles, playback underruns, word error rate.

Pure functions over plain numbers, so every figure the tool prints can be checked by a test.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile: the smallest value with at least p% of the values at or
    below it. Unlike interpolation, it is always a value that was really measured."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 < p <= 100:
        raise ValueError(f"percentile {p} is outside (0, 100]")
    ordered = sorted(values)
    rank = math.ceil(p / 100 * len(ordered))
    return ordered[max(rank, 1) - 1]


def summarize(values_s: Sequence[float], scale: float = 1000.0) -> dict[str, float | None]:
    """count, p50, p90, p99, max and mean of seconds, reported in ms (scale 1000)."""
    out: dict[str, float | None] = {"count": float(len(values_s))}
    if not values_s:
        out.update({f"p{p}": None for p in PERCENTILES} | {"max": None, "mean": None})
        return out
    ordered = sorted(values_s)
    for p in PERCENTILES:
        out[f"p{p}"] = round(percentile(ordered, p) * scale, 3)
    out["max"] = round(ordered[-1] * scale, 3)
    out["mean"] = round(sum(ordered) / len(ordered) * scale, 3)
    return out


@dataclass(frozen=True, slots=True)
class Underrun:
    """How long a real-time player would starve while playing one reply."""

    starved_s: float  # total silence the player had to insert
    events: int  # times it ran dry
    longest_s: float


def underrun(
    arrivals: Sequence[float], durations: Sequence[float], tolerance_s: float = 1e-3
) -> Underrun:
    """Playback starts when the first chunk arrives and runs at real time; a chunk that
    arrives after the player has played everything before it starves it for the difference.
    Stalls shorter than `tolerance_s` are added to the total but not counted as events."""
    if len(arrivals) != len(durations):
        raise ValueError("one duration per arrival")
    if not arrivals:
        return Underrun(0.0, 0, 0.0)
    clock = arrivals[0]
    starved, events, longest = 0.0, 0, 0.0
    for arrived, duration in zip(arrivals, durations, strict=True):
        if arrived > clock:
            stall = arrived - clock
            starved += stall
            longest = max(longest, stall)
            events += stall >= tolerance_s
            clock = arrived
        clock += duration
    return Underrun(starved, events, longest)


def gaps(arrivals: Sequence[float]) -> list[float]:
    """Time between consecutive arrivals (chunks of one reply)."""
    return [b - a for a, b in itertools.pairwise(arrivals)]


_NOT_WORD = re.compile(r"[^a-z0-9']+")


def normalize(text: str) -> str:
    """Lower case, punctuation to spaces, single spaces: WER counts words, not commas."""
    return " ".join(_NOT_WORD.sub(" ", text.lower()).split())


def wer(pairs: Iterable[tuple[str, str]]) -> float | None:
    """Corpus word error rate of (reference, hypothesis) pairs after `normalize`: all the
    edits over all the reference words, so long sentences weigh more. None when no
    reference has a word. An empty hypothesis counts as deleting every reference word."""
    import jiwer

    words = errors = 0
    scored: list[tuple[str, str]] = []
    for reference, hypothesis in pairs:
        ref, hyp = normalize(reference), normalize(hypothesis)
        count = len(ref.split())
        words += count
        if not count:
            continue
        if hyp:
            scored.append((ref, hyp))
        else:
            errors += count  # jiwer refuses empty strings; this is what it would count
    if not words:
        return None
    if scored:
        out = jiwer.process_words([r for r, _ in scored], [h for _, h in scored])
        errors += out.substitutions + out.deletions + out.insertions
    return errors / words

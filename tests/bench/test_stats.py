"""The arithmetic behind every figure: percentiles, underruns, gaps, WER."""

from __future__ import annotations

import pytest

from voxserve.bench.stats import gaps, normalize, percentile, summarize, underrun, wer


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([3.0, 1.0, 2.0], 50) == 2  # order does not matter
    assert percentile([7.0], 99) == 7
    # Nearest rank always returns a measured value: P90 of 4 values is the 4th.
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == 4


def test_percentile_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 0)


def test_summarize_reports_ms() -> None:
    out = summarize([0.001, 0.002, 0.003, 0.100])
    assert out == {"count": 4.0, "p50": 2.0, "p90": 100.0, "p99": 100.0, "max": 100.0, "mean": 26.5}
    empty = summarize([])
    assert empty["count"] == 0 and empty["p99"] is None


def test_underrun_when_chunks_arrive_in_time() -> None:
    # 200 ms chunks arriving every 100 ms: the player never runs dry.
    result = underrun([0.0, 0.1, 0.2, 0.3], [0.2] * 4)
    assert result.starved_s == 0 and result.events == 0


def test_underrun_counts_each_stall() -> None:
    # Playing starts at 0; chunks 0-1 last until 0.3; chunk 2 arrives at 0.5 (0.2 s stall)
    # and plays until 0.7; chunk 3 arrives at 0.75 (0.05 s stall).
    result = underrun([0.0, 0.1, 0.5, 0.75], [0.2, 0.1, 0.2, 0.2])
    assert result.starved_s == pytest.approx(0.25)
    assert result.events == 2
    assert result.longest_s == pytest.approx(0.2)


def test_underrun_ignores_tiny_stalls_as_events() -> None:
    result = underrun([0.0, 0.2005], [0.2, 0.2])
    assert result.events == 0 and result.starved_s == pytest.approx(0.0005)
    assert underrun([], []).events == 0
    with pytest.raises(ValueError):
        underrun([0.0], [])


def test_gaps() -> None:
    assert gaps([1.0, 1.5, 1.75]) == [0.5, 0.25]
    assert gaps([1.0]) == []


def test_normalize_and_wer() -> None:
    assert normalize("What time is it?  It's  3!") == "what time is it it's 3"
    assert wer([("What time is it?", "what time is it")]) == 0
    # one substitution and one insertion over 4 words
    assert wer([("a b c d", "a x c d e")]) == pytest.approx(0.5)
    # an empty hypothesis deletes every reference word; corpus-level weighting
    assert wer([("one two three", ""), ("four", "four")]) == pytest.approx(0.75)
    assert wer([("", "noise")]) is None

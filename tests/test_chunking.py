"""Adaptive TTS chunk sizes (pipeline/synthesis/chunking.py)."""

from __future__ import annotations

import numpy as np

from voxserve.pipeline.synthesis.chunking import Chunker


def test_first_chunk_small_then_growing_with_the_lead_up_to_the_cap() -> None:
    chunker = Chunker(first_samples=1280, max_samples=3200)  # 80 ms, 200 ms at 16 kHz
    sizes = [p.size for p in chunker.split(np.zeros(16_000, dtype=np.int16))]
    assert sizes[:4] == [1280, 1280, 2560, 3200]
    assert all(s == 3200 for s in sizes[3:-1]) and sum(sizes) == 16_000
    # Every chunk after the first is no longer than the audio sent before it.
    sent = 0
    for size in sizes:
        assert sent == 0 or size <= max(sent, 1280)
        sent += size


def test_a_stream_cut_in_engine_pieces_obeys_the_same_rule() -> None:
    whole = Chunker(1280, 3200)
    pieces = Chunker(1280, 3200)
    audio = np.arange(16_000, dtype=np.int16)
    hit = list(whole.split(audio))
    miss = [p for part in np.array_split(audio, 7) for p in pieces.split(part)]
    assert np.array_equal(np.concatenate(hit), np.concatenate(miss))
    assert hit[0].size == miss[0].size == 1280
    assert max(p.size for p in miss) <= 3200


def test_first_size_above_the_cap_is_the_cap() -> None:
    chunker = Chunker(first_samples=10_000, max_samples=3200)
    assert [p.size for p in chunker.split(np.zeros(7000, dtype=np.int16))] == [3200, 3200, 600]

"""Cutting a long recording into windows of bounded length, at quiet moments.

Bulk recognition (uploads) runs one engine call per window (pipeline/recognition/bulk.py), so a
long upload holds an ASR slot for one window at a time and queues again between windows.
A cut through a word costs it (fixed 30 s cuts of the fixtures' speech: 13% WER, 1% whole),
so each window ends at the quietest stretch of its last part: the pause between words or
sentences. Frame energy finds it for free; the VAD engine would cost a pass of the whole
upload through the VAD stage that live streams share, to pick among pauses that energy
already ranks. Pure: samples in, sample ranges out.
"""

from __future__ import annotations

import numpy as np

from voxserve.audio.pcm import Float32Array, Int16Array
from voxserve.types import SAMPLE_RATE

FRAME_S = 0.02  # energy is measured per 20 ms frame
QUIET_SPAN_S = 0.2  # ...and averaged over this long: a pause, not a stop consonant
SEARCH_FROM = 0.5  # a window's cut is sought in its last half (at least half a window long)
AS_QUIET = 4.0  # energy within this factor (6 dB) of the quietest counts as quiet as it
ENERGY_BLOCK_FRAMES = 3_000  # energy measured 60 s at a time: a float64 copy of one block,
# not of the whole region (an hour of speech as float64 was 460 MB, twice over)


def cut_windows(
    audio: Float32Array | Int16Array, max_s: float, rate: int = SAMPLE_RATE
) -> list[tuple[int, int]]:
    """Consecutive (start, end) sample ranges covering `audio`, each at most `max_s` long,
    every cut but the last at the quietest QUIET_SPAN_S in the last half of its window (the
    latest such, so windows stay long)."""
    limit = max(1, int(max_s * rate))
    if audio.size <= limit:
        return [(0, int(audio.size))]
    frame = max(1, int(FRAME_S * rate))
    quiet = _quietness(audio, frame)
    windows: list[tuple[int, int]] = []
    start = 0
    while audio.size - start > limit:
        first = (start + int(limit * SEARCH_FROM)) // frame
        last = (start + limit) // frame  # exclusive: the cut stays within the window
        best = _latest_quietest(quiet[first:last]) + first if last > first else last
        end = max(start + 1, min(best * frame, start + limit))
        windows.append((start, end))
        start = end
    windows.append((start, int(audio.size)))
    return windows


def _latest_quietest(quiet: np.ndarray) -> int:
    """The last index as quiet as the quietest (within AS_QUIET): long windows, few calls."""
    floor = float(quiet.min())
    return int(np.flatnonzero(quiet <= floor * AS_QUIET + 1e-12)[-1])


def _quietness(audio: Float32Array | Int16Array, frame: int) -> np.ndarray:
    """Per frame boundary: the mean energy of the QUIET_SPAN_S centred on it (low: a pause).
    int16 is measured as it is: only the energies' ratios matter (`_latest_quietest`)."""
    whole = audio.size // frame
    energy = np.empty(whole, dtype=np.float64)
    for first in range(0, whole, ENERGY_BLOCK_FRAMES):
        last = min(whole, first + ENERGY_BLOCK_FRAMES)
        block = audio[first * frame : last * frame].astype(np.float64)
        energy[first:last] = np.square(block, out=block).reshape(last - first, frame).mean(1)
    span = max(1, round(QUIET_SPAN_S / FRAME_S))
    padded = np.pad(energy, (span // 2, span - span // 2), mode="edge")
    sums = np.cumsum(np.concatenate(([0.0], padded)))
    smoothed: np.ndarray = (sums[span:] - sums[:-span]) / span
    return smoothed[: whole + 1]

"""A long recording's speech, packed into windows for batched recognition.

The VAD engine's probabilities give speech regions (hysteresis as live turn detection uses,
a region ends after MIN_SILENCE_S below the lower threshold), each padded by PAD_S so a
word's edges stay in. Regions are packed in order into windows of at most `max_s` seconds of
audio: a window is the regions' audio put end to end, so the silence between them is not
decoded at all, and a map takes times in the window back to the recording. A region longer
than a window is cut at its quietest moments first (pipeline/recognition/windows.py). The same
scheme as faster-whisper's batched pipeline (speech chunks merged up to 30 s), written for our
stages. Pure: probabilities and samples in, sample ranges out.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from voxserve.audio.pcm import Float32Array, Int16Array
from voxserve.pipeline.recognition.windows import cut_windows
from voxserve.types import SAMPLE_RATE

MIN_SILENCE_S = 0.3  # a pause this long ends a region (between sentences, not within words)
PAD_S = 0.3  # audio kept each side of a region: Whisper needs a word's onset and tail
MIN_SPEECH_S = 0.06  # shorter blips (two VAD windows) are clicks, not words


@dataclass(frozen=True, slots=True)
class SpeechWindow:
    """Pieces of the recording (sample ranges, in order) decoded as one buffer."""

    pieces: tuple[tuple[int, int], ...]

    @property
    def size(self) -> int:
        """Samples in the window's buffer."""
        return sum(end - start for start, end in self.pieces)

    @property
    def start(self) -> int:
        return self.pieces[0][0]

    @property
    def end(self) -> int:
        return self.pieces[-1][1]

    def audio(self, recording: Float32Array | Int16Array) -> Float32Array | Int16Array:
        """The window's buffer: its pieces end to end (at most one window of audio, in the
        recording's own dtype: int16 for an upload, made float32 where an engine reads it)."""
        if len(self.pieces) == 1:
            start, end = self.pieces[0]
            return recording[start:end]
        joined: Float32Array | Int16Array = np.concatenate([recording[a:b] for a, b in self.pieces])
        return joined

    def to_recording_ms(self, ms: int, *, closing: bool = False) -> int:
        """A time in the window's buffer (ms) on the recording's time line (ms). A time on
        the seam of two pieces is the end of the first when `closing` (a segment's end),
        else the start of the second; times past the buffer's end clip to the window's end."""
        at = max(0, ms) * SAMPLE_RATE // 1000
        starts = self._offsets()
        index = bisect.bisect_left(starts, at) if closing else bisect.bisect_right(starts, at)
        index = min(max(index - 1, 0), len(self.pieces) - 1)
        start, end = self.pieces[index]
        sample = min(start + at - starts[index], end)
        return sample * 1000 // SAMPLE_RATE

    def _offsets(self) -> list[int]:
        offsets = [0]
        for start, end in self.pieces[:-1]:
            offsets.append(offsets[-1] + end - start)
        return offsets


def speech_regions(
    probs: Float32Array,
    window_samples: int,
    total: int,
    *,
    threshold: float,
    neg_threshold: float,
    pad_s: float = PAD_S,
) -> list[tuple[int, int]]:
    """Speech regions padded by `pad_s` (sample ranges within `total`), in order, not
    overlapping: speech starts at a window over `threshold` and ends after MIN_SILENCE_S
    under `neg_threshold`; regions the padding makes touch are merged."""
    quiet_needed = max(1, round(MIN_SILENCE_S * SAMPLE_RATE / window_samples))
    raw: list[tuple[int, int]] = []
    start: int | None = None
    quiet = 0
    for index, prob in enumerate(np.asarray(probs, dtype=np.float32).tolist()):
        if start is None:
            if prob >= threshold:
                start, quiet = index, 0
            continue
        if prob < neg_threshold:
            quiet += 1
            if quiet >= quiet_needed:
                raw.append((start, index + 1 - quiet))
                start = None
        elif prob >= threshold:
            quiet = 0
    if start is not None:
        raw.append((start, len(probs) - quiet))
    pad = int(pad_s * SAMPLE_RATE)
    shortest = int(MIN_SPEECH_S * SAMPLE_RATE)
    regions: list[tuple[int, int]] = []
    for first, last in raw:
        begin, end = first * window_samples, min(last * window_samples, total)
        if end - begin < shortest:
            continue
        begin, end = max(0, begin - pad), min(total, end + pad)
        if regions and begin <= regions[-1][1]:
            regions[-1] = (regions[-1][0], end)
        else:
            regions.append((begin, end))
    return regions


def pack_windows(
    recording: Float32Array | Int16Array, regions: list[tuple[int, int]], max_s: float
) -> list[SpeechWindow]:
    """Regions put end to end into windows of at most `max_s` of audio, in order; a region
    longer than that is cut at its quiet moments (pipeline/recognition/windows.py) first."""
    limit = max(1, int(max_s * SAMPLE_RATE))
    pieces: list[tuple[int, int]] = []
    for start, end in regions:
        if end - start <= limit:
            pieces.append((start, end))
        else:
            cuts = cut_windows(recording[start:end], max_s)
            pieces.extend((start + a, start + b) for a, b in cuts)
    windows: list[SpeechWindow] = []
    current: list[tuple[int, int]] = []
    size = 0
    for start, end in pieces:
        if current and size + end - start > limit:
            windows.append(SpeechWindow(tuple(current)))
            current, size = [], 0
        current.append((start, end))
        size += end - start
    if current:
        windows.append(SpeechWindow(tuple(current)))
    return windows

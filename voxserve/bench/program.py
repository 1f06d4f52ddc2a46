"""The audio a stream plays: recordings with known text, looped, with silence between them.

A `Program` is whole 20 ms frames of 16 kHz PCM16 plus where each utterance's speech starts
and ends (by level: the first and last frame at or above -40 dBFS). A `Script` is one
stream's view of it, started at a different recording per stream so that streams do not
all speak the same words at once. Times the server reports (ms from the stream's start) map
back to an utterance, which is how latencies are matched to what was sent.
"""

from __future__ import annotations

import itertools
import json
import re
import wave
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from voxserve.types import FRAME_BYTES, FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE

SPEECH_DBFS = -40.0  # a 20 ms frame at or above this RMS level is speech
SPLIT_GAP_S = 0.6  # a pause this long inside a recording makes two utterances (> hangover)
MATCH_TOLERANCE_MS = 300  # a server segment may start this far before the speech we sent
Pcm = npt.NDArray[np.int16]


@dataclass(frozen=True, slots=True)
class Utterance:
    text: str  # the reference transcript ("" when unknown)
    first: int  # program frame of the first speech frame
    last: int  # program frame of the last speech frame


@dataclass(frozen=True)
class Program:
    pcm: bytes  # whole frames of little-endian PCM16
    utterances: tuple[Utterance, ...]
    clip_starts: tuple[int, ...]  # program frame where each recording begins
    first_at: dict[int, int] = field(init=False, repr=False)
    last_at: dict[int, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "first_at", {u.first: i for i, u in enumerate(self.utterances)})
        object.__setattr__(self, "last_at", {u.last: i for i, u in enumerate(self.utterances)})

    @property
    def frames(self) -> int:
        return len(self.pcm) // FRAME_BYTES

    @property
    def speech_seconds(self) -> float:
        return sum(u.last - u.first + 1 for u in self.utterances) * FRAME_MS / 1000


@dataclass(frozen=True, slots=True)
class Script:
    """One stream's loop over a program, starting `shift` frames in."""

    program: Program
    shift: int = 0

    def frame(self, k: int) -> bytes:
        p = self.position(k)
        return self.program.pcm[p * FRAME_BYTES : (p + 1) * FRAME_BYTES]

    def position(self, k: int) -> int:
        """The program frame that stream frame k plays."""
        return (k + self.shift) % self.program.frames

    def _number(self, k: int, index: int) -> int:
        return (k + self.shift) // self.program.frames * len(self.program.utterances) + index

    def speech_first(self, k: int) -> int | None:
        """The utterance number whose first speech frame is stream frame k, if any."""
        index = self.program.first_at.get((k + self.shift) % self.program.frames)
        return None if index is None else self._number(k, index)

    def speech_last(self, k: int) -> int | None:
        index = self.program.last_at.get((k + self.shift) % self.program.frames)
        return None if index is None else self._number(k, index)

    def whole(self, frames: int) -> int:
        """`frames`, or more when stream frame `frames` would cut an utterance short: the
        frame after its last speech frame. A run's end then never truncates what a speaker
        is saying (the server would answer a sentence that only paused, a premature turn
        and missing words that the server never heard)."""
        p = (frames + self.shift) % self.program.frames
        for u in self.program.utterances:
            if u.first < p <= u.last:
                return frames + u.last + 1 - p
        return frames

    def reference(self, number: int) -> str:
        return self.program.utterances[number % len(self.program.utterances)].text

    def utterance_at(self, ms: int, tolerance_ms: int = MATCH_TOLERANCE_MS) -> int | None:
        """The utterance whose speech (widened by the tolerance) holds stream time `ms`."""
        utterances = self.program.utterances
        if not utterances:
            return None
        frames = self.program.frames
        p = ms // FRAME_MS + self.shift
        slack = tolerance_ms // FRAME_MS
        for cycle in (p // frames, p // frames - 1, p // frames + 1):
            rel = p - cycle * frames
            for index, u in enumerate(utterances):
                if cycle >= 0 and u.first - slack <= rel <= u.last + slack:
                    return cycle * len(utterances) + index
        return None


def speech_regions(pcm: Pcm, gap_s: float = SPLIT_GAP_S) -> list[tuple[int, int]]:
    """(first, last) frame of each stretch of speech, split where a pause lasts gap_s."""
    frames = pcm[: pcm.size // FRAME_SAMPLES * FRAME_SAMPLES].astype(np.float64) / 32768
    rms = np.sqrt(np.mean(frames.reshape(-1, FRAME_SAMPLES) ** 2, axis=1))
    loud = np.flatnonzero(rms >= 10 ** (SPEECH_DBFS / 20))
    if not loud.size:
        return []
    regions, start = [], int(loud[0])
    for a, b in itertools.pairwise(loud):
        if (b - a - 1) * FRAME_MS >= gap_s * 1000:
            regions.append((start, int(a)))
            start = int(b)
    regions.append((start, int(loud[-1])))
    return regions


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def clip_utterances(pcm: Pcm, text: str, offset: int) -> list[Utterance]:
    """Utterances of one recording: one per speech region when the text has as many
    sentences (so each gets its own reference), else one spanning all of its speech."""
    regions = speech_regions(pcm)
    if not regions:
        return []
    sentences = [s for s in _SENTENCE_END.split(text.strip()) if s]
    if len(sentences) == len(regions) > 1:
        return [
            Utterance(s, a + offset, b + offset)
            for s, (a, b) in zip(sentences, regions, strict=True)
        ]
    return [Utterance(text, regions[0][0] + offset, regions[-1][1] + offset)]


def build(clips: Sequence[tuple[Pcm, str]], gap_s: float) -> Program:
    """Concatenate recordings, each padded to whole frames and followed by gap_s of silence."""
    if not clips:
        raise ValueError("a program needs at least one recording")
    gap = np.zeros(int(gap_s * 1000) // FRAME_MS * FRAME_SAMPLES, dtype=np.int16)
    parts: list[Pcm] = []
    utterances: list[Utterance] = []
    starts: list[int] = []
    frame = 0
    for pcm, text in clips:
        padded = np.concatenate([pcm, np.zeros(-pcm.size % FRAME_SAMPLES, dtype=np.int16)])
        starts.append(frame)
        utterances += clip_utterances(padded, text, frame)
        parts += [padded, gap]
        frame += (padded.size + gap.size) // FRAME_SAMPLES
    pcm_all = np.concatenate(parts).astype("<i2")
    return Program(pcm_all.tobytes(), tuple(utterances), tuple(starts))


def read_wav16k(path: Path) -> Pcm:
    """A mono 16-bit WAV, resampled to 16 kHz when it is not."""
    with wave.open(str(path), "rb") as wav:
        if wav.getsampwidth() != 2 or wav.getnchannels() != 1:
            raise ValueError(f"{path}: need 16-bit mono PCM")
        rate = wav.getframerate()
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    if rate != SAMPLE_RATE:
        import soxr

        out = soxr.resample(pcm.astype(np.float32) / 32768, rate, SAMPLE_RATE)
        pcm = np.clip(np.round(out * 32768), -32768, 32767).astype(np.int16)
    return pcm.astype(np.int16)


def fixture_clips(directory: Path) -> list[tuple[Pcm, str]]:
    """Recordings and their texts from DIR/fixtures.json ({file: text}), in file order."""
    index = directory / "fixtures.json"
    if not index.is_file():
        raise FileNotFoundError(f"{index} not found; pass --audio-dir or use --source tts")
    texts: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))
    return [(read_wav16k(directory / name), text) for name, text in texts.items()]


def noise_clip(seconds: float, dbfs: float = -60.0, seed: int = 0) -> Pcm:
    """Quiet noise: audio a VAD must judge but that holds no speech."""
    rng = np.random.default_rng(seed)
    scale = 10 ** (dbfs / 20) * 32768
    return np.clip(rng.normal(0, scale, int(seconds * SAMPLE_RATE)), -32768, 32767).astype(np.int16)


_AT_RATE: dict[tuple[int, int], tuple[Program, bytes]] = {}


def pcm_at(program: Program, rate: int) -> bytes:
    """The program's PCM at another sample rate, exactly `program.frames` 20 ms frames long
    (frame p of it is frame p of the program), resampled once per process and kept."""
    if rate == SAMPLE_RATE:
        return program.pcm
    key = (id(program), rate)
    if key not in _AT_RATE:  # the program is kept in the value, so its id stays its own
        from voxserve.audio.resample import resample

        samples = resample(np.frombuffer(program.pcm, dtype="<i2"), SAMPLE_RATE, rate)
        size = program.frames * frame_bytes(rate) // 2
        exact = np.zeros(size, dtype="<i2")
        exact[: min(size, samples.size)] = samples[:size]
        _AT_RATE[key] = (program, exact.tobytes())
    return _AT_RATE[key][1]


def frame_bytes(rate: int) -> int:
    """Bytes of a 20 ms PCM16 frame at `rate`."""
    return rate * FRAME_MS // 1000 * 2


def scripts(program: Program, streams: Sequence[int]) -> list[Script]:
    """Stream i starts at recording i (mod their number)."""
    starts = program.clip_starts
    return [Script(program, starts[i % len(starts)]) for i in streams]

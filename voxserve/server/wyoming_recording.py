"""Audio of one Wyoming transcription: checked chunk by chunk, counted under a byte cap,
and kept for whole recognition at `audio-stop` unless it streams into a session."""

from __future__ import annotations

import numpy as np
from wyoming.audio import AudioChunk

from voxserve.errors import ErrorCode, VoxError

AUDIO_EVENTS = frozenset({"audio-start", "audio-chunk", "audio-stop"})  # a request's audio
PCM_WIDTH = 2  # 16-bit samples in and out


class Recording:
    """Audio of one transcription, as 16-bit mono at the client's rate, under a byte cap."""

    def __init__(self, rate: int, limit: int, *, keep: bool = True) -> None:
        self.rate = rate
        self.limit = limit
        self.keep = keep
        self.chunks: list[np.ndarray] = []
        self.size = 0

    def add(self, chunk: AudioChunk) -> np.ndarray:
        """The chunk's samples, mono; raises for a chunk that breaks the format or cap."""
        samples = mono_samples(chunk, self.rate)
        self.size += len(chunk.audio)
        if self.size > self.limit:
            raise VoxError(
                ErrorCode.MESSAGE_TOO_LARGE, f"audio exceeds {self.limit} bytes for one request"
            )
        if self.keep:
            self.chunks.append(samples)
        return samples

    def samples(self) -> np.ndarray:
        if not self.chunks:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate(self.chunks)


def mono_samples(chunk: AudioChunk, rate: int) -> np.ndarray:
    """A chunk's audio as 16-bit mono at `rate` (the request's audio-start rate): its
    width, rate and length checked, channels mixed down (ASR and wake words want mono)."""
    if chunk.width != PCM_WIDTH:
        raise VoxError(
            ErrorCode.UNSUPPORTED_ENCODING,
            f"audio width {chunk.width} bytes is not supported; send 16-bit PCM (width 2)",
        )
    if chunk.rate != rate:
        raise VoxError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"audio-chunk rate {chunk.rate} differs from audio-start's {rate}",
        )
    channels = max(1, chunk.channels)
    if len(chunk.audio) % (PCM_WIDTH * channels):
        raise VoxError(ErrorCode.ODD_LENGTH_PCM, "audio chunk ends inside a sample")
    samples = np.frombuffer(chunk.audio, dtype="<i2")
    if channels > 1:
        samples = samples.reshape(-1, channels).mean(axis=1).astype(np.int16)
    return samples.astype(np.int16, copy=False)

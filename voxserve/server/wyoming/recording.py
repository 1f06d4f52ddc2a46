"""Audio of one Wyoming request: its format checked once for the path (`check_format`),
every chunk checked against it, and a transcription's audio counted under a cap and kept
for whole recognition at `audio-stop` unless it streams into a session.

A request's format is what its `audio-start` (or, without one, its first `audio-chunk`)
declares, refused before any audio is taken when the path does not take it: 16-bit PCM
(`width` 2, else `unsupported_encoding`), 1-`MAX_CHANNELS` channels (`unsupported_encoding`),
and a rate of the path's list (`unsupported_sample_rate`): the live rates
(`SUPPORTED_INPUT_RATES`, `audio.resample.check_rate`) for wake words and streamed ASR,
those or any rate in the upload range for ASR recognised whole. A rate of 1 once made the
wake service upsample each chunk 16,000x (issue 35). The format cannot change mid-stream:
a chunk declaring another rate, width or channel count ends the request.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from wyoming.audio import AudioChunk, AudioFormat

from voxserve.audio.pcm import Int16Array
from voxserve.audio.resample import check_rate, resample
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.pipeline.recognition.bulk import MAX_FILE_RATE, MIN_FILE_RATE
from voxserve.pipeline.scheduling.work_pools import WorkPool
from voxserve.types import SAMPLE_RATE

AUDIO_EVENTS = frozenset({"audio-start", "audio-chunk", "audio-stop"})  # a request's audio
PCM_WIDTH = 2  # 16-bit samples in and out
MAX_CHANNELS = 8  # a microphone array's; mixed down per chunk, so the cost is per byte


def check_format(declared: AudioFormat, *, whole: bool = False) -> AudioFormat:
    """`declared` (an audio-start or a first chunk) as the request's format, or the error
    that refuses it. `whole`: the audio is recognised whole at `audio-stop`, which takes
    any rate of the upload range besides the live ones."""
    if declared.width != PCM_WIDTH:
        raise VoxError(
            ErrorCode.UNSUPPORTED_ENCODING,
            f"audio width {quoted(declared.width)} bytes is not supported; send 16-bit PCM "
            "(width 2)",
        )
    if not 1 <= declared.channels <= MAX_CHANNELS:
        raise VoxError(
            ErrorCode.UNSUPPORTED_ENCODING,
            f"audio channels {quoted(declared.channels)} is not supported; send 1-{MAX_CHANNELS}",
        )
    if not (whole and MIN_FILE_RATE <= declared.rate <= MAX_FILE_RATE):
        check_rate(declared.rate)
    return AudioFormat(declared.rate, PCM_WIDTH, declared.channels)


def check_chunk(chunk: AudioChunk, audio: AudioFormat) -> None:
    """A chunk in the request's format, of whole samples; raises otherwise."""
    if chunk.rate != audio.rate:
        raise VoxError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"audio-chunk rate {quoted(chunk.rate)} differs from the request's {audio.rate}",
        )
    if chunk.width != audio.width or chunk.channels != audio.channels:
        raise VoxError(
            ErrorCode.UNSUPPORTED_ENCODING,
            f"audio-chunk width {quoted(chunk.width)} and channels {quoted(chunk.channels)} "
            f"differ from the request's {audio.width} and {audio.channels}",
        )
    if len(chunk.audio) % (PCM_WIDTH * audio.channels):
        raise VoxError(ErrorCode.ODD_LENGTH_PCM, "audio chunk ends inside a sample")


def seconds_of(pcm_bytes: int, audio: AudioFormat) -> float:
    return pcm_bytes / (PCM_WIDTH * audio.channels * audio.rate)


def mono(pcm: bytes, channels: int) -> Int16Array:
    """Checked PCM (`check_chunk`) as 16-bit mono (ASR and wake words want mono)."""
    samples: Int16Array = np.frombuffer(pcm, dtype="<i2")
    if channels > 1:
        samples = samples.reshape(-1, channels).mean(axis=1).astype(np.int16)
    return samples.astype(np.int16, copy=False)


class Recording:
    """Audio of one transcription, as 16-bit mono at its rate, under a cap: at most `limit`
    bytes as sent (`limits.max_upload_bytes`) and `max_s` seconds (`wyoming.max_audio_s`),
    so what one connection buffers is bounded whatever its format."""

    def __init__(self, audio: AudioFormat, limit: int, max_s: float, *, keep: bool = True) -> None:
        self.format = audio
        self.rate = audio.rate
        self.limit = min(limit, int(max_s * audio.rate) * PCM_WIDTH * audio.channels)
        self.max_s = max_s
        self.keep = keep
        self.chunks: list[Int16Array] = []
        self.size = 0

    def add(self, chunk: AudioChunk) -> Int16Array:
        """The chunk's samples, mono; raises for a chunk that breaks the format or cap."""
        check_chunk(chunk, self.format)
        self.size += len(chunk.audio)
        if self.size > self.limit:
            raise VoxError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"audio exceeds {self.limit} bytes ({self.max_s:g} s at most) for one request",
            )
        samples = mono(chunk.audio, self.format.channels)
        if self.keep:
            self.chunks.append(samples)
        return samples


def _joined_16k(chunks: Sequence[Int16Array], rate: int) -> Int16Array:
    joined = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    return resample(joined, rate, SAMPLE_RATE)


async def at_16k(pool: WorkPool, chunks: Sequence[Int16Array], rate: int) -> Int16Array:
    """A recording's mono chunks joined and resampled to 16 kHz on the decode pool (audio
    work before recognition, as an upload's): a whole request's audio (up to `Recording`'s
    cap) is too much work for the event loop."""
    return await pool.run(_joined_16k, list(chunks), rate)

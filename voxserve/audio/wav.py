"""WAV in and out (16-bit PCM; mono, or downmixed to mono on read)."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np

from voxserve.audio.pcm import Int16Array
from voxserve.errors import ErrorCode, VoxError


def read_wav(data: bytes) -> tuple[Int16Array, int]:
    """Decode a WAV file's bytes into mono int16 samples and the sample rate."""
    if not data:
        raise VoxError(ErrorCode.EMPTY_AUDIO, "the audio file is empty")
    try:
        with wave.open(io.BytesIO(data), "rb") as wav:
            channels = wav.getnchannels()
            width = wav.getsampwidth()
            rate = wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    # RuntimeError/ValueError/struct.error: the wave module's own failures on chunk sizes that
    # point past the data (found by tests/fuzz); all mean the same to the client.
    except (wave.Error, EOFError, RuntimeError, ValueError, struct.error) as exc:
        reason = str(exc) or (
            "the file ends before its WAV header does"
            if isinstance(exc, EOFError)
            else "its chunk sizes do not match its length"
        )
        raise VoxError(ErrorCode.INVALID_AUDIO, f"not a readable WAV file: {reason}") from exc
    if width != 2:
        raise VoxError(
            ErrorCode.UNSUPPORTED_ENCODING,
            f"WAV sample width {width * 8} bits is not supported; use 16-bit PCM",
        )
    # A header whose sizes lie can leave half a sample at the end: keep whole samples only.
    samples = np.frombuffer(frames, dtype="<i2", count=len(frames) // 2)
    if channels > 1:
        usable = samples.size - samples.size % channels
        samples = samples[:usable].reshape(-1, channels).mean(axis=1).astype(np.int16)
    if samples.size == 0:
        raise VoxError(ErrorCode.EMPTY_AUDIO, "the WAV file holds no audio samples")
    return samples, rate


def write_wav(samples: Int16Array, sample_rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(samples.astype("<i2").tobytes())
    return buffer.getvalue()


def wav_header(sample_rate: int, data_bytes: int = 0xFFFFFFFF - 36) -> bytes:
    """A header for a streamed WAV of unknown length (players read to end of stream)."""
    buffer = io.BytesIO()
    buffer.write(b"RIFF")
    buffer.write((min(data_bytes + 36, 0xFFFFFFFF)).to_bytes(4, "little"))
    buffer.write(b"WAVEfmt ")
    buffer.write((16).to_bytes(4, "little"))
    buffer.write((1).to_bytes(2, "little"))  # PCM
    buffer.write((1).to_bytes(2, "little"))  # mono
    buffer.write(sample_rate.to_bytes(4, "little"))
    buffer.write((sample_rate * 2).to_bytes(4, "little"))
    buffer.write((2).to_bytes(2, "little"))
    buffer.write((16).to_bytes(2, "little"))
    buffer.write(b"data")
    buffer.write(min(data_bytes, 0xFFFFFFFF).to_bytes(4, "little"))
    return buffer.getvalue()

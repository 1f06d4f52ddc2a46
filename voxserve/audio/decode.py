"""Uploaded audio files in any container and codec FFmpeg reads (WAV, MP3, M4A/AAC, Ogg/Opus,
WebM, FLAC, ...), decoded from memory by PyAV into 16 kHz mono int16, resampled once.

No temp file: PyAV reads the bytes through a BytesIO. Bounded: the decoded length is
checked frame by frame against `max_seconds`, so a small file that decodes to hours (FLAC
of silence, a header that lies) stops at the limit instead of filling memory.

Every failure is the client's: FFmpeg's errors, and PyAV's own on damaged input (an
IndexError on a corrupt MP4 box table), become `invalid_audio` with FFmpeg's reason. A file
cut short often still decodes, so the decoded length is compared with the length the file
declares (MP3's Xing/Info header, MP4's sample table, FLAC's STREAMINFO, WebM's Duration,
WAV's data size, Ogg's last page): one missing more than a few frames is refused as
truncated rather than transcribed in part. Formats that declare no length (raw ADTS AAC,
MP3 without a header) cannot be told from a shorter file and are decoded as they are.
"""

from __future__ import annotations

import io
import math
import struct
from fractions import Fraction

import av
import numpy as np

from voxserve.audio.pcm import Int16Array
from voxserve.errors import ErrorCode, VoxError
from voxserve.types import SAMPLE_RATE

TRUNCATION_SLACK_S = 0.25  # encoder delay, padding and priming differ by a few frames
TRUNCATION_SLACK = 0.02  # ...and by a small share of a long file
WAV_UNKNOWN_SIZES = (0, 0xFFFFFFFF, 0xFFFFFFFF - 36, 0x7FFFFFFF)  # streamed WAV headers
OGG_EOS = 0x04


def decode_audio(data: bytes, *, max_seconds: float, rate: int = SAMPLE_RATE) -> Int16Array:
    """Mono int16 samples at `rate` from an audio file's bytes (module docstring)."""
    if not data:
        raise VoxError(ErrorCode.EMPTY_AUDIO, "the audio file is empty")
    limit = int(max_seconds * rate)
    chunks: list[Int16Array] = []
    total = 0
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise VoxError(ErrorCode.INVALID_AUDIO, "the file holds no audio stream")
            stream = container.streams.audio[0]
            declared = _declared_seconds(container.duration, stream.duration, stream.time_base)
            kind = f"{container.format.name}/{stream.codec_context.name}"
            resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunk = out.to_ndarray().reshape(-1).astype(np.int16, copy=True)
                    total += chunk.size
                    if total > limit:
                        raise _too_long(max_seconds)
                    chunks.append(chunk)
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1).astype(np.int16, copy=True))
    except VoxError:
        raise
    except Exception as exc:  # FFmpeg's errors and PyAV's own on damaged input alike
        raise VoxError(
            ErrorCode.INVALID_AUDIO, f"the audio file could not be decoded: {_reason(exc)}"
        ) from exc
    samples = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    if samples.size == 0:
        raise VoxError(ErrorCode.EMPTY_AUDIO, "the audio file holds no audio samples")
    own = _own_declared_seconds(data)
    declared = own if own is not None else declared
    decoded = samples.size / rate
    if declared is not None and decoded < declared * (1 - TRUNCATION_SLACK) - TRUNCATION_SLACK_S:
        claim = "no complete last page" if math.isinf(declared) else f"{declared:.2f} s of audio"
        raise VoxError(
            ErrorCode.INVALID_AUDIO,
            f"the {kind} file is truncated or damaged: it declares {claim} "
            f"but only {decoded:.2f} s could be decoded",
        )
    return samples


def _too_long(max_seconds: float) -> VoxError:
    return VoxError(
        ErrorCode.MESSAGE_TOO_LARGE,
        f"the audio is longer than {max_seconds:.0f} s, the most an upload may hold",
    )


def _reason(exc: Exception) -> str:
    if isinstance(exc, av.FFmpegError) and exc.strerror:
        return str(exc.strerror)
    if isinstance(exc, EOFError):
        return "the file ends before its first audio"
    return "the file is damaged or not an audio format FFmpeg reads"


def _declared_seconds(
    container_us: int | None, stream_duration: int | None, time_base: Fraction | None
) -> float | None:
    """The length FFmpeg read from the file's header, if any."""
    if stream_duration and time_base:
        return float(stream_duration * time_base)
    if container_us:
        return container_us / 1_000_000
    return None


def _own_declared_seconds(data: bytes) -> float | None:
    """A length FFmpeg does not keep: it shortens a WAV's data size to what is present and
    takes an Ogg file's length from whatever page comes last."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return _wav_seconds(data)
    if data[:4] == b"OggS":
        return _ogg_seconds(data)
    return None


def _wav_seconds(data: bytes) -> float | None:
    """The duration a WAV's fmt and data chunks declare (None for a streamed size)."""
    offset = 12
    byte_rate = 0
    while offset + 8 <= len(data):
        chunk, size = struct.unpack_from("<4sI", data, offset)
        if chunk == b"fmt " and offset + 24 <= len(data):
            rate, byte_rate, block = struct.unpack_from("<IIH", data, offset + 12)
            byte_rate = byte_rate or rate * block  # some writers leave byte_rate 0
        if chunk == b"data":
            if size in WAV_UNKNOWN_SIZES or byte_rate <= 0:
                return None
            return float(size / byte_rate)
        offset += 8 + size + (size & 1)
    return None


def _ogg_seconds(data: bytes) -> float:
    """An Ogg stream's length from its last page: a stream cut short has no complete
    end-of-stream page, so it declares more than is there (infinity: refused)."""
    start = data.rfind(b"OggS")
    header = data[start : start + 27]
    if len(header) < 27:
        return float("inf")
    flags = header[5]
    granule = struct.unpack_from("<q", header, 6)[0]
    count = header[26]
    lacing = data[start + 27 : start + 27 + count]
    complete = len(lacing) == count and start + 27 + count + sum(lacing) == len(data)
    if not complete or not flags & OGG_EOS or granule < 0:
        return float("inf")
    return granule / 48_000 if b"OpusHead" in data[:200] else _vorbis_seconds(data, granule)


def _vorbis_seconds(data: bytes, granule: int) -> float:
    """Vorbis and FLAC-in-Ogg count granules in samples at the stream's own rate."""
    head = data.find(b"\x01vorbis")
    if head >= 0 and head + 16 <= len(data):
        rate = struct.unpack_from("<I", data, head + 12)[0]
        if rate > 0:
            return float(granule / rate)
    return 0.0  # unknown rate: trust what decodes

"""PCM conversions. int16 is the wire and storage format; float32 is what models eat."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from voxserve.errors import ErrorCode, VoxError

Int16Array = npt.NDArray[np.int16]
Float32Array = npt.NDArray[np.float32]

_INT16_SCALE = np.float32(1.0 / 32768.0)


def int16_from_bytes(data: bytes | bytearray | memoryview) -> Int16Array:
    """View little-endian 16-bit PCM bytes as int16 without copying."""
    if len(data) % 2:
        raise VoxError(ErrorCode.ODD_LENGTH_PCM, f"PCM16 payload has odd length {len(data)}")
    return np.frombuffer(data, dtype="<i2")


def to_float32(samples: Int16Array) -> Float32Array:
    return samples.astype(np.float32) * _INT16_SCALE


def to_int16(samples: Float32Array) -> Int16Array:
    clipped = np.clip(samples, -1.0, 1.0) * 32767.0
    return clipped.astype(np.int16)


def duration_ms(samples: int, sample_rate: int) -> int:
    return samples * 1000 // sample_rate

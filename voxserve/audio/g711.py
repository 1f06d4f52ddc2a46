"""G.711 (ITU-T) mu-law and A-law <-> PCM16, by lookup tables: the Realtime API's telephony
formats (`audio/pcmu`, `audio/pcma`: 8 kHz, one byte a sample), so a phone call's audio
needs no conversion on the client.

Each law is two tables built once at import with numpy: 256 PCM16 values to decode a byte,
65,536 bytes to encode any PCM16 sample (64 KiB a law). Converting is then one fancy-index
per buffer, no Python loop per sample. The tables give the values of the classic
reference code (mu-law over 14 bits, A-law over 13, as the stdlib's old `audioop` did):
tests/realtime/test_g711.py holds them to audioop where it still exists.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from voxserve.audio.pcm import int16_from_bytes

Law = Literal["ulaw", "alaw"]
_QUANT = 0x0F
_ULAW_BIAS = 0x84
_ULAW_CLIP_14 = 8159
_ULAW_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
_ALAW_SEG_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)


def _ulaw_decode_table() -> npt.NDArray[np.int16]:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & _QUANT) << 3) + _ULAW_BIAS) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS).astype("<i2")


def _alaw_decode_table() -> npt.NDArray[np.int16]:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = (a & _QUANT) << 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype("<i2")


def _ulaw_encode_table() -> npt.NDArray[np.uint8]:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 2  # 14-bit
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(pcm), _ULAW_CLIP_14) + (_ULAW_BIAS >> 2)
    seg = np.searchsorted(_ULAW_SEG_END, magnitude, side="left")
    value = (seg << 4) | ((magnitude >> (seg + 1)) & _QUANT)
    value = np.where(seg >= 8, 0x7F, value)
    return ((value ^ mask) & 0xFF).astype(np.uint8)


def _alaw_encode_table() -> npt.NDArray[np.uint8]:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 3  # 13-bit
    mask = np.where(pcm >= 0, 0xD5, 0x55)
    magnitude = np.where(pcm >= 0, pcm, -pcm - 1)
    seg = np.searchsorted(_ALAW_SEG_END, magnitude, side="left")
    shift = np.where(seg < 2, 1, seg)
    value = (np.minimum(seg, 7) << 4) | ((magnitude >> shift) & _QUANT)
    value = np.where(seg >= 8, 0x7F, value)
    return ((value ^ mask) & 0xFF).astype(np.uint8)


_DECODE = {"ulaw": _ulaw_decode_table(), "alaw": _alaw_decode_table()}
_ENCODE = {"ulaw": _ulaw_encode_table(), "alaw": _alaw_encode_table()}


def decode(data: bytes | bytearray | memoryview, law: Law) -> bytes:
    """G.711 bytes -> PCM16 little-endian bytes (two bytes a sample, same rate)."""
    codes = np.frombuffer(data, dtype=np.uint8)
    return _DECODE[law][codes].tobytes()  # the tables are little-endian already


def encode(pcm: bytes | bytearray | memoryview, law: Law) -> bytes:
    """PCM16 little-endian bytes -> G.711 bytes; odd length: `odd_length_pcm`."""
    samples = int16_from_bytes(pcm).astype(np.int32) + 32768  # index into the table
    return _ENCODE[law][samples].tobytes()

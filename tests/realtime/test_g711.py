"""G.711 mu-law and A-law against the reference values (the stdlib's audioop, where the
Python still has it: 3.11 and 3.12), known code points, and round trips."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

from voxserve.audio import g711
from voxserve.errors import ErrorCode, VoxError

ALL_PCM = np.arange(-32768, 32768, dtype="<i2").tobytes()
ALL_CODES = bytes(range(256))
LAWS = ("ulaw", "alaw")


def audioop():  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return importlib.import_module("audioop")
        except ImportError:  # Python 3.13 removed it
            pytest.skip("audioop is gone from this Python")


@pytest.mark.parametrize("law", LAWS)
def test_every_sample_encodes_as_the_reference_does(law: str) -> None:
    reference = audioop()
    encode = reference.lin2ulaw if law == "ulaw" else reference.lin2alaw
    assert g711.encode(ALL_PCM, law) == encode(ALL_PCM, 2)  # type: ignore[arg-type]


@pytest.mark.parametrize("law", LAWS)
def test_every_code_decodes_as_the_reference_does(law: str) -> None:
    reference = audioop()
    decode = reference.ulaw2lin if law == "ulaw" else reference.alaw2lin
    assert g711.decode(ALL_CODES, law) == decode(ALL_CODES, 2)  # type: ignore[arg-type]


def test_known_values() -> None:
    """Silence and full scale, from G.711's tables: mu-law 0xFF/0x7F are +0/-0 and 0x80 is
    +32124; A-law's silence is 0xD5 (+8) / 0x55 (-8)."""

    def pcm(*values: int) -> bytes:
        return np.array(values, dtype="<i2").tobytes()

    assert g711.encode(pcm(0, 32767, -32768), "ulaw") == bytes([0xFF, 0x80, 0x00])
    assert g711.decode(bytes([0xFF, 0x7F, 0x80, 0x00]), "ulaw") == pcm(0, 0, 32124, -32124)
    assert g711.encode(pcm(0, -1, 32767, -32768), "alaw") == bytes([0xD5, 0x55, 0xAA, 0x2A])
    assert g711.decode(bytes([0xD5, 0x55, 0xAA, 0x2A]), "alaw") == pcm(8, -8, 32256, -32256)


@pytest.mark.parametrize("law", LAWS)
def test_a_code_survives_a_round_trip(law: str) -> None:
    expected = ALL_CODES
    if law == "ulaw":  # 0x7F is mu-law's -0: PCM has one zero, which encodes as +0 (0xFF)
        expected = ALL_CODES[:0x7F] + b"\xff" + ALL_CODES[0x80:]
    assert g711.encode(g711.decode(ALL_CODES, law), law) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("law", LAWS)
def test_pcm_round_trip_error_is_within_half_a_step(law: str) -> None:
    samples = np.frombuffer(ALL_PCM, dtype="<i2").astype(np.int32)
    back = np.frombuffer(g711.decode(g711.encode(ALL_PCM, law), law), dtype="<i2")  # type: ignore[arg-type]
    error = np.abs(back.astype(np.int32) - samples)
    # the step grows with the magnitude (logarithmic): at most 1/16 of it, plus clipping
    assert (error <= np.maximum(np.abs(samples) // 16, 16) + 1).all()


def test_odd_length_pcm_is_refused() -> None:
    with pytest.raises(VoxError) as caught:
        g711.encode(b"\x00\x01\x02", "ulaw")
    assert caught.value.code is ErrorCode.ODD_LENGTH_PCM

"""audio/decode.py on its own (real PyAV): the length bound that stops a decompression bomb."""

from __future__ import annotations

import numpy as np
import pytest

from tests.audio_files import encode
from voxserve.audio.decode import decode_audio
from voxserve.errors import ErrorCode, VoxError


def test_a_small_file_that_decodes_to_hours_is_refused_as_it_decodes() -> None:
    """FLAC of silence: 5 minutes in ~60 KB. Over the bound it is refused (413
    message_too_large), and under it the same file decodes whole."""
    bomb = encode(np.zeros(60 * 16_000, dtype=np.int16), "flac", repeat=5)
    assert len(bomb) < 100_000
    with pytest.raises(VoxError) as caught:
        decode_audio(bomb, max_seconds=60)
    assert caught.value.code is ErrorCode.MESSAGE_TOO_LARGE and "60 s" in caught.value.message
    assert decode_audio(bomb, max_seconds=400).size == 300 * 16_000

"""tail_sound_end: the sound after the VAD's end of speech (a stop's release) is found at
any level and over noise; silence, and a voice's own fading, are not sound."""

from __future__ import annotations

import numpy as np
import pytest

from voxserve.pipeline.turns.word_tail import MARGIN_S, tail_sound_end

SR = 16_000


def noise(seconds: float, amplitude: float, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(-amplitude, amplitude, int(seconds * SR))


def vowel(seconds: float, amplitude: float) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return np.sin(2 * np.pi * 180 * t) * amplitude


def pcm(*parts: np.ndarray) -> np.ndarray:
    return (np.clip(np.concatenate(parts), -1, 1) * 32767).astype(np.int16)


def test_a_release_after_the_closure_is_found_and_ends_where_it_ends() -> None:
    audio = pcm(vowel(0.8, 0.3), np.zeros(1600), noise(0.04, 0.01), np.zeros(3200))
    end = tail_sound_end(audio, int(0.85 * SR), SR)
    burst_end = int((0.8 + 0.1 + 0.04) * SR)
    assert end is not None and burst_end <= end <= burst_end + int(MARGIN_S * SR) + 160


def test_silence_after_the_end_is_none_at_any_gain() -> None:
    for gain in (0.01, 0.3, 1.0):
        audio = pcm(vowel(0.8, gain), np.zeros(4800))
        assert tail_sound_end(audio, int(0.85 * SR), SR) is None, gain


def test_the_noise_floor_is_not_sound_but_a_release_over_it_is() -> None:
    floor = noise(1.3, 0.002, seed=3)
    quiet = pcm(floor[:800] + 0, vowel(0.8, 0.3) + floor[800:13600], floor[13600:])
    assert tail_sound_end(quiet, int(0.9 * SR), SR) is None
    burst = np.zeros(floor.size)
    burst[int(0.95 * SR) : int(0.98 * SR)] = noise(0.03, 0.05, seed=4)
    loud = pcm(floor + burst + np.concatenate([np.zeros(800), vowel(0.8, 0.3), np.zeros(7200)]))
    end = tail_sound_end(loud, int(0.9 * SR), SR)
    assert end is not None and int(0.98 * SR) <= end <= int((0.98 + MARGIN_S) * SR) + 160


def test_nothing_to_look_at_is_none() -> None:
    assert tail_sound_end(np.zeros(0, np.int16), 0, SR) is None
    audio = pcm(vowel(0.5, 0.3))
    assert tail_sound_end(audio, audio.size, SR) is None


def test_the_noise_floor_is_numpys_tenth_percentile() -> None:
    """The floor by partial sorting is np.percentile(rms, 10), interpolation included."""
    from voxserve.pipeline.turns.word_tail import _tenth

    rng = np.random.default_rng(5)
    for size in (1, 2, 3, 10, 11, 399, 400, 401):
        values = rng.random(size).astype(np.float32)
        assert _tenth(values) == pytest.approx(float(np.percentile(values, 10)), abs=1e-7)

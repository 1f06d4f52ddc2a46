"""Hostile text (tests/hostile_text.py: digits and commas, no punctuation, one 4,000-character
word, emoji, mixed scripts, control characters) on the real piper and espeak voices, as every
transport hands it to them (after check_text): each model call is bounded (piper: at most
MAX_PHONEME_IDS ids, a few seconds of audio; espeak: one piece of at most 200 characters),
the process grows by tens of MB, not GB, and closing the generator stops the work at once.

Piper on 4,000 characters takes minutes on two cores, so its tests pull for a few seconds
and close: the bound is per call, so the first calls prove it as well as the last."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.hostile_text import HOSTILE
from tests.rss import MB, RssPeak
from voxserve.engines.base import Int16Array
from voxserve.engines.espeak_tts import EspeakTts
from voxserve.engines.piper_tts import MAX_PHONEME_IDS, PiperTts
from voxserve.pipeline.synthesis.request import check_text

PULL_S = 3.0  # piper: pull chunks this long, then close the generator
RSS_GROWTH = 300 * MB  # unbounded, one request grew a server by 3 GB in 8 s
PIPER_CALL_AUDIO_S = 10.0  # 160 ids make about 4 s; an unbounded call made minutes
ESPEAK_PIECE_AUDIO_S = 160.0  # 200 characters of numbers at the slowest rate: 150 s


def pull(chunks: Iterator[Int16Array], seconds: float) -> list[Int16Array]:
    """Chunks for about `seconds` (at least one when there is one), then close."""
    got: list[Int16Array] = []
    deadline = time.monotonic() + seconds
    for chunk in chunks:
        got.append(chunk)
        if time.monotonic() > deadline:
            break
    close = getattr(chunks, "close", None)
    if callable(close):
        close()
    return got


@pytest.fixture
def model_calls(piper: PiperTts, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The id count of every piper model call made while the test runs."""
    voice: Any = piper._voice
    real = voice.phoneme_ids_to_audio
    calls: list[int] = []

    def counted(ids: list[int], *args: Any, **kwargs: Any) -> Any:
        calls.append(len(ids))
        return real(ids, *args, **kwargs)

    monkeypatch.setattr(voice, "phoneme_ids_to_audio", counted)
    return calls


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", HOSTILE)
def test_piper_calls_stay_bounded(piper: PiperTts, model_calls: list[int], name: str) -> None:
    text = check_text(HOSTILE[name], 4_000)
    with RssPeak() as peak:
        chunks = piper.synthesize(text, voice="joe")
        got = pull(chunks, PULL_S)
    assert got and all(c.dtype == np.int16 and c.ndim == 1 and c.size for c in got), name
    assert max(c.size for c in got) / piper.sample_rate <= PIPER_CALL_AUDIO_S
    assert model_calls and max(model_calls) <= MAX_PHONEME_IDS
    assert len(model_calls) == len(got)  # closed: no call after the last chunk taken
    assert next(chunks, None) is None
    assert peak.growth < RSS_GROWTH, f"{name}: grew {peak.growth / MB:.0f} MB"


@pytest.mark.timeout(60)
def test_piper_slow_speech_makes_no_longer_calls(piper: PiperTts, model_calls: list[int]) -> None:
    """At speed 0.25 each phoneme lasts four times as long: calls take fewer phonemes."""
    text = check_text(HOSTILE["digits_and_commas"], 4_000)
    with RssPeak() as peak:
        got = pull(piper.synthesize(text, voice="joe", speed=0.25), PULL_S)
    assert max(c.size for c in got) / piper.sample_rate <= PIPER_CALL_AUDIO_S
    assert max(model_calls) <= MAX_PHONEME_IDS // 4 + 3
    assert peak.growth < RSS_GROWTH


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", HOSTILE)
def test_espeak_synthesises_all_of_it_in_bounded_pieces(espeak: EspeakTts, name: str) -> None:
    text = check_text(HOSTILE[name], 4_000)
    started = time.monotonic()
    pieces = longest = 0
    with RssPeak() as peak:
        for chunk in espeak.synthesize(text, voice="espeak-en"):
            assert chunk.dtype == np.int16 and chunk.ndim == 1
            pieces += 1
            longest = max(longest, chunk.size)
    assert pieces >= len(text) // 200  # cut, not one call on all of it
    assert longest / espeak.sample_rate <= ESPEAK_PIECE_AUDIO_S
    assert time.monotonic() - started < 30
    assert peak.growth < RSS_GROWTH, f"{name}: grew {peak.growth / MB:.0f} MB"

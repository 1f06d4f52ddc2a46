"""EspeakTts: a process-global C library used under a lock; audible, recognisable output."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.engines.conftest import to_16k, wer
from voxserve.engines.base import TtsEngine
from voxserve.engines.espeak_tts import EspeakTts
from voxserve.engines.whisper_asr import WhisperAsr

TEXT = "Please turn on the lights in the kitchen. Then lock the front door."


def test_is_a_tts_engine(espeak: EspeakTts) -> None:
    assert isinstance(espeak, TtsEngine)
    assert espeak.sample_rate == 22050
    ids = {v.id for v in espeak.voices()}
    assert ids == {"espeak-en"}  # no espeak-cmn: not intelligible (docs/engines.md)
    assert all(v.engine == "espeak" and v.sample_rate == 22050 for v in espeak.voices())


def test_audible_chunks_per_sentence(espeak: EspeakTts) -> None:
    chunks = list(espeak.synthesize(TEXT, voice="espeak-en"))
    assert len(chunks) == 2
    audio = np.concatenate(chunks)
    assert audio.dtype == np.int16
    assert audio.size > espeak.sample_rate  # > 1 s of audio
    assert np.sqrt(np.mean(audio.astype(np.float64) ** 2)) > 500


def test_no_mandarin_voice(espeak: EspeakTts) -> None:
    """Whisper base heard eSpeak's cmn as Thai or English; zh-baker is the Mandarin voice."""
    with pytest.raises(ValueError, match=r"valid: espeak-en$"):
        espeak.synthesize("你好。", voice="espeak-cmn")


def test_round_trip_through_whisper(espeak: EspeakTts, asr: WhisperAsr) -> None:
    audio = to_16k(list(espeak.synthesize(TEXT, voice="espeak-en")), espeak.sample_rate)
    result = asr.transcribe(audio)
    assert wer(TEXT, result.text) <= 0.35, result.text  # robotic voice: most words


def test_speed(espeak: EspeakTts) -> None:
    normal = sum(c.size for c in espeak.synthesize(TEXT, voice="espeak-en", speed=1.0))
    fast = sum(c.size for c in espeak.synthesize(TEXT, voice="espeak-en", speed=2.0))
    assert fast < 0.7 * normal
    with pytest.raises(ValueError, match="speed"):
        espeak.synthesize(TEXT, voice="espeak-en", speed=5.0)
    with pytest.raises(ValueError, match="espeak-en"):
        espeak.synthesize(TEXT, voice="joe")


def test_threads_are_serialised(espeak: EspeakTts) -> None:
    """Concurrent calls with different voices and rates each get their own settings.

    eSpeak carries a little state (pitch flutter phase) from call to call, so lengths vary by
    a few samples; crossed settings would change them by a third or more.
    """
    jobs = [(TEXT, "espeak-en", 1.0), ("Hi.", "espeak-en", 0.7), (TEXT, "espeak-en", 1.5)] * 3

    def run(job: tuple[str, str, float]) -> int:
        text, voice, speed = job
        return sum(c.size for c in espeak.synthesize(text, voice=voice, speed=speed))

    serial = [run(j) for j in jobs]
    with ThreadPoolExecutor(max_workers=3) as pool:
        parallel = list(pool.map(run, jobs))
    for a, b in zip(serial, parallel, strict=True):
        assert abs(a - b) < 0.02 * a


def test_instances_share_the_library(espeak: EspeakTts) -> None:
    other = EspeakTts()
    assert other.sample_rate == espeak.sample_rate
    a = sum(c.size for c in other.synthesize("Hello.", voice="espeak-en"))
    b = sum(c.size for c in espeak.synthesize("Hello.", voice="espeak-en"))
    assert abs(a - b) < 0.02 * a

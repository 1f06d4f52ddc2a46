"""Engine fixtures: each real model is loaded once per test session."""

from __future__ import annotations

import json
import re
import wave
from pathlib import Path

import jiwer
import numpy as np
import pytest
import soxr

from voxserve.engines.base import Float32Array, Int16Array
from voxserve.engines.espeak_tts import EspeakTts
from voxserve.engines.piper_tts import PiperTts
from voxserve.engines.silero_vad import SileroVad
from voxserve.engines.whisper_asr import WhisperAsr
from voxserve.types import SAMPLE_RATE

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FIXTURE_TEXTS: dict[str, str] = json.loads((FIXTURES / "fixtures.json").read_text("utf-8"))


def load_fixture(name: str) -> Float32Array:
    """A fixture WAV (16 kHz mono int16) as float32 in [-1, 1]."""
    with wave.open(str(FIXTURES / name), "rb") as wav:
        assert wav.getframerate() == SAMPLE_RATE and wav.getnchannels() == 1
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
    return (pcm.astype(np.float32) / 32768.0).astype(np.float32)


def to_16k(chunks: list[Int16Array], rate: int) -> Float32Array:
    """TTS output (int16 chunks at `rate`) as float32 16 kHz, for a round trip through ASR."""
    audio = np.concatenate(chunks).astype(np.float32) / 32768.0
    return np.asarray(soxr.resample(audio, rate, SAMPLE_RATE), dtype=np.float32)


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


def wer(reference: str, hypothesis: str) -> float:
    return float(jiwer.wer(normalise(reference), normalise(hypothesis)))


@pytest.fixture(scope="session")
def vad() -> SileroVad:
    return SileroVad()


@pytest.fixture(scope="session")
def gated_vad() -> SileroVad:
    return SileroVad(pregate=True)


@pytest.fixture(scope="session")
def asr() -> WhisperAsr:
    return WhisperAsr()


@pytest.fixture(scope="session")
def asr_full_window() -> WhisperAsr:
    return WhisperAsr(bucketed=False)


@pytest.fixture(scope="session")
def piper() -> PiperTts:
    return PiperTts()


@pytest.fixture(scope="session")
def espeak() -> EspeakTts:
    return EspeakTts()

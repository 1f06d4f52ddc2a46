"""The question every framework test asks: a fixture's speech as PCM16 at the framework's
rate, with silence after it so server VAD ends the turn."""

from __future__ import annotations

import numpy as np

from tests.fakes import silence
from tests.helpers import fixture_audio, fixture_texts
from voxserve.audio.resample import resample

QUESTION = "command.wav"


def question_text() -> str:
    return fixture_texts()[QUESTION]


def question_pcm(rate: int = 24_000, *, lead_s: float = 0.3, pad_s: float = 1.0) -> bytes:
    audio = np.concatenate([silence(lead_s), fixture_audio(QUESTION), silence(pad_s)])
    return resample(audio, 16_000, rate).tobytes()


def chunks(pcm: bytes, rate: int, ms: int = 100) -> list[bytes]:
    step = rate * 2 * ms // 1000
    return [pcm[i : i + step] for i in range(0, len(pcm), step)]


def rms(pcm: bytes) -> float:
    samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)
    return float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0

"""Helpers shared by end-to-end tests: fixtures on disk and word error rate."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jiwer
import numpy as np

from voxserve.audio.wav import read_wav

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_texts() -> dict[str, str]:
    data: dict[str, str] = json.loads((FIXTURES / "fixtures.json").read_text())
    return data


def fixture_audio(name: str) -> np.ndarray:
    samples, rate = read_wav((FIXTURES / name).read_bytes())
    assert rate == 16_000
    return samples


def wer(reference: str, hypothesis: str) -> float:
    clean = lambda t: " ".join(re.sub(r"[^a-z0-9' ]+", " ", t.lower()).split())  # noqa: E731
    return float(jiwer.wer(clean(reference), clean(hypothesis) or "<empty>"))

"""Synthesise the Spanish fixtures with eSpeak NG's `es` voice: 16 kHz mono int16 WAV files.

Run from the repository root:  .venv/bin/python scripts/make_spanish_fixtures.py
Writes tests/fixtures/es/<name>.wav and tests/fixtures/es/fixtures.json ({file: exact text}).
They test language detection and translation of the multilingual Whisper, and give the
Spanish WER of docs/benchmarks.md. eSpeak is deterministic: a re-run gives the same audio.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from scripts.make_fixtures import EDGE_SILENCE_S, silence, write_wav
from voxserve.audio.resample import resample
from voxserve.engines.espeak_tts import RATE_NORMAL, _Library
from voxserve.types import SAMPLE_RATE

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "es"

SENTENCES = {
    "hora.wav": "¿Qué hora es?",
    "luces.wav": "Por favor, enciende las luces de la cocina.",
    "tiempo.wav": "Hoy hace sol y sopla una brisa suave.",
    "mesa.wav": "Quiero reservar una mesa para cuatro personas el viernes por la noche.",
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    lib = _Library.get()
    for name, text in SENTENCES.items():
        audio = resample(lib.synth(text, "es", RATE_NORMAL), lib.sample_rate, SAMPLE_RATE)
        edge = silence(EDGE_SILENCE_S)
        write_wav(OUT / name, np.concatenate([edge, audio, edge]))
    (OUT / "fixtures.json").write_text(
        json.dumps(SENTENCES, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )


if __name__ == "__main__":
    main()

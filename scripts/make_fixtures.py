"""Synthesise the test fixtures: short English utterances as 16 kHz mono int16 WAV files.

Run from the repository root:  .venv/bin/python scripts/make_fixtures.py
Writes tests/fixtures/<name>.wav and tests/fixtures/fixtures.json ({file: exact text}).
Piper samples noise, so each run gives slightly different audio; the committed files are the
reference, re-run only when the set changes.
"""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import soxr

from voxserve.engines.piper_tts import PiperTts
from voxserve.types import SAMPLE_RATE

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
EDGE_SILENCE_S = 0.25  # lead-in / tail so a VAD sees silence before and after speech
TURN_GAP_S = 1.2  # the gap between the two sentences of two_turns.wav

SINGLE = {
    "command.wav": "What time is it?",
    "lights.wav": "Please turn on the lights in the kitchen.",
    "weather.wav": "The weather today is sunny with a light breeze.",
    "reminder.wav": "Can you remind me to call my mother tomorrow morning?",
    "long.wav": (
        "I would like to book a table for four people at the Italian restaurant "
        "near the train station on Friday evening."
    ),
}
TWO_TURNS = ("Hello, how are you today?", "I need some help with my order.")


def speak(tts: PiperTts, text: str) -> np.ndarray:
    """Piper audio for `text`, resampled to 16 kHz int16."""
    audio = np.concatenate(list(tts.synthesize(text, voice="joe")))
    out = np.asarray(
        soxr.resample(audio.astype(np.float32) / 32768.0, tts.sample_rate, SAMPLE_RATE),
        dtype=np.float32,
    )
    pcm: np.ndarray = np.clip(np.round(out * 32768.0), -32768, 32767).astype(np.int16)
    return pcm


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SAMPLE_RATE), dtype=np.int16)


def write_wav(path: Path, pcm: np.ndarray) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(SAMPLE_RATE)
        wav.writeframes(pcm.tobytes())


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tts = PiperTts()
    edge = silence(EDGE_SILENCE_S)
    texts: dict[str, str] = {}
    for name, text in SINGLE.items():
        write_wav(OUT / name, np.concatenate((edge, speak(tts, text), edge)))
        texts[name] = text
    first, second = (speak(tts, t) for t in TWO_TURNS)
    write_wav(
        OUT / "two_turns.wav", np.concatenate((edge, first, silence(TURN_GAP_S), second, edge))
    )
    texts["two_turns.wav"] = " ".join(TWO_TURNS)
    (OUT / "fixtures.json").write_text(json.dumps(texts, indent=2) + "\n", encoding="utf-8")
    total = sum((OUT / n).stat().st_size for n in texts)
    for name in texts:
        with wave.open(str(OUT / name), "rb") as wav:
            print(f"{name}: {wav.getnframes() / SAMPLE_RATE:.2f} s")
    print(f"{len(texts)} files, {total / 1024:.0f} KiB in {OUT}")


if __name__ == "__main__":
    main()

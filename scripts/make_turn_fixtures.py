"""Make tests/fixtures/turns: sentences read with mid-sentence pauses (300-700 ms) and lists
read item by item, spoken by the server's own TTS (piper, voice joe) piece by piece with the
silence spliced in. The bench's assistant mode measures on them how often a reply begins
while the speaker has only paused (premature_turn_rate, docs/benchmarks.md "Turn-taking").

    PYTHONPATH=. .venv/bin/python scripts/make_turn_fixtures.py

Each piece is trimmed to its speech (-40 dBFS) so the pause is the one written here.
"""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import soxr

from voxserve.engines.piper_tts import VOICE_ID, PiperTts
from voxserve.types import SAMPLE_RATE

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "turns"
# (file, pieces with the pause in ms after each but the last, reference text)
FIXTURES: list[tuple[str, list[str], list[int], str]] = [
    (
        "pizza_with.wav",
        ["I would like a large pizza with", "mushrooms and olives please."],
        [500],
        "I would like a large pizza with mushrooms and olives please.",
    ),
    (
        "table_for.wav",
        ["Can you book a table for", "four people on Friday evening?"],
        [600],
        "Can you book a table for four people on Friday evening?",
    ),
    (
        "so_um.wav",
        ["So um", "I was thinking we could go to the beach tomorrow."],
        [700],
        "So um I was thinking we could go to the beach tomorrow.",
    ),
    (
        "meeting_and.wav",
        ["The meeting went well and", "the client wants a second proposal."],
        [500],
        "The meeting went well and the client wants a second proposal.",
    ),
    (
        "phone_number.wav",
        ["My phone number is five five five", "two one three four."],
        [400],
        "My phone number is 555 2134.",
    ),
    (
        "shopping_list.wav",
        ["I need eggs,", "milk,", "bread,", "and butter from the store."],
        [450, 450, 400],
        "I need eggs, milk, bread, and butter from the store.",
    ),
    (
        "remind_to.wav",
        ["Remind me to", "call the dentist at three."],
        [350],
        "Remind me to call the dentist at three.",
    ),
    (
        "because.wav",
        ["I cannot come today because", "my car broke down this morning."],
        [650],
        "I cannot come today because my car broke down this morning.",
    ),
]


def trimmed(pcm: np.ndarray) -> np.ndarray:
    """The piece from its first to its last 10 ms at or above -40 dBFS (+ 30 ms each side)."""
    step = SAMPLE_RATE // 100
    usable = pcm[: pcm.size - pcm.size % step].astype(np.float64) / 32768
    rms = np.sqrt(np.mean(usable.reshape(-1, step) ** 2, axis=1))
    loud = np.flatnonzero(rms >= 0.01)
    first = max(int(loud[0]) - 3, 0) * step
    last = min(int(loud[-1]) + 4, rms.size) * step
    return pcm[first:last]


def speak(tts: PiperTts, text: str) -> np.ndarray:
    audio = np.concatenate(list(tts.synthesize(text, voice=VOICE_ID)))
    out = soxr.resample(audio.astype(np.float32) / 32768, tts.sample_rate, SAMPLE_RATE)
    return trimmed(np.clip(np.round(out * 32768), -32768, 32767).astype(np.int16))


def main() -> None:
    tts = PiperTts()
    OUT.mkdir(parents=True, exist_ok=True)
    lead = np.zeros(SAMPLE_RATE // 4, dtype=np.int16)
    texts: dict[str, str] = {}
    for name, pieces, pauses, text in FIXTURES:
        parts = [lead]
        for i, piece in enumerate(pieces):
            parts.append(speak(tts, piece))
            if i < len(pauses):
                parts.append(np.zeros(pauses[i] * SAMPLE_RATE // 1000, dtype=np.int16))
        parts.append(lead)
        with wave.open(str(OUT / name), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(SAMPLE_RATE)
            wav.writeframes(np.concatenate(parts).astype("<i2").tobytes())
        texts[name] = text
    (OUT / "fixtures.json").write_text(json.dumps(texts, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

"""PiperTts: clause streaming, speed, validation, and a round trip through Whisper."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.engines.conftest import to_16k, wer
from voxserve.engines.base import TtsEngine
from voxserve.engines.piper_tts import PiperTts, split_text
from voxserve.engines.whisper_asr import WhisperAsr

MULTI_CLAUSE = (
    "Well, if you want to get to the station, take the second road on the left; "
    "then walk straight on for about two hundred metres. The entrance is on your right."
)


def test_is_a_tts_engine(piper: PiperTts) -> None:
    assert isinstance(piper, TtsEngine)
    assert piper.sample_rate == 22050
    (voice,) = piper.voices()
    assert (voice.id, voice.engine, voice.language, voice.sample_rate) == (
        "joe",
        "piper",
        "en",
        22050,
    )
    assert "GPL" in piper.info.license


def test_split_text() -> None:
    assert split_text("Sure, I can help with that. See you soon!") == [
        "Sure, I can help with that.",
        "See you soon!",
    ]
    assert split_text(MULTI_CLAUSE) == [
        "Well, if you want to get to the station,",
        "take the second road on the left;",
        "then walk straight on for about two hundred metres.",
        "The entrance is on your right.",
    ]
    # A dash is a clause end, read as a comma (and the first piece is cut there).
    assert split_text("Ask Dr. Jones — she knows.") == ["Ask Dr. Jones,", "she knows."]
    assert split_text("Hi. Ask Dr. Jones — she knows.") == ["Hi.", "Ask Dr. Jones, she knows."]
    assert split_text("It costs 1,000 dollars.") == ["It costs 1,000 dollars."]
    assert split_text("  \n ") == []
    # The first piece (the time to first audio) is cut at its first clause end that leaves
    # 8 characters on each side; the pieces after it keep the 20-character rule.
    reply = "I heard: I would like a large pizza with mushrooms and olives please."
    assert split_text(reply) == [
        "I heard:",
        "I would like a large pizza with mushrooms and olives please.",
    ]
    assert split_text(f"{reply} Anything else, sir?") == [
        "I heard:",
        "I would like a large pizza with mushrooms and olives please.",
        "Anything else, sir?",
    ]
    assert split_text("OK: I would like a large pizza with mushrooms and olives please.") == [
        "OK: I would like a large pizza with mushrooms and olives please."
    ]  # "OK:" alone would sound clipped
    assert split_text("I heard: I would like a pizza.") == ["I heard:", "I would like a pizza."]
    assert split_text("I'm doing well, thank you. How can I help?") == [
        "I'm doing well,",
        "thank you.",
        "How can I help?",
    ]
    assert split_text("Sure, no problem.") == ["Sure, no problem."]  # "Sure," is too short
    assert split_text("Yes, I can.") == ["Yes, I can."]
    assert "[[" not in " ".join(split_text("say [[ h ə l ]] now"))
    # A one-shot request's first piece (short_first=False) is a whole clause of the
    # 20-character rule: cut only past 48 characters, leaving 20 after the cut.
    morning = "Good morning, the weather today is mild. Take a coat."
    assert split_text(morning)[:2] == ["Good morning,", "the weather today is mild."]
    assert split_text(morning, short_first=False) == [
        "Good morning, the weather today is mild.",
        "Take a coat.",
    ]
    assert split_text(reply, short_first=False) == [
        "I heard:",
        "I would like a large pizza with mushrooms and olives please.",
    ]
    assert split_text("I'm doing well, thank you.", short_first=False) == [
        "I'm doing well, thank you."
    ]


def test_streams_clause_by_clause(piper: PiperTts) -> None:
    start = time.perf_counter()
    chunks = piper.synthesize(MULTI_CLAUSE, voice="joe")
    first = next(chunks)
    first_at = time.perf_counter() - start
    rest = list(chunks)
    total = time.perf_counter() - start
    assert first.dtype == np.int16 and first.ndim == 1 and first.size > 0
    assert len(rest) >= 3
    assert first_at < 0.6 * total  # the first clause came before the rest was made
    audio = np.concatenate([first, *rest])
    assert np.sqrt(np.mean(audio.astype(np.float64) ** 2)) > 500  # not silent
    assert np.abs(audio).max() < 32767


def test_a_one_shot_request_s_first_piece_is_the_whole_clause(piper: PiperTts) -> None:
    """short_first (engines/base.py, short_first_piece): a live reply's first chunk is
    "Good morning," alone; a one-shot request's is the whole sentence, one model call."""
    text = "Good morning, the weather today is mild."
    live = list(piper.synthesize(text, voice="joe"))
    one_shot = list(piper.synthesize(text, voice="joe", short_first=False))
    assert len(live) == 2 and len(one_shot) == 1
    assert live[0].size < 0.6 * one_shot[0].size


def test_speed_changes_duration(piper: PiperTts) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    normal = sum(c.size for c in piper.synthesize(text, voice="joe", speed=1.0))
    fast = sum(c.size for c in piper.synthesize(text, voice="joe", speed=1.5))
    assert fast < 0.85 * normal


def test_validation_happens_at_the_call(piper: PiperTts) -> None:
    for speed in (0.1, 4.5, 0.0):
        with pytest.raises(ValueError, match="speed"):
            piper.synthesize("hello", voice="joe", speed=speed)
    with pytest.raises(ValueError, match="joe"):
        piper.synthesize("hello", voice="amy")


def test_full_voice_name_alias(piper: PiperTts) -> None:
    assert list(piper.synthesize("Hi there.", voice="en_US-joe-medium"))


def test_empty_text_yields_nothing(piper: PiperTts) -> None:
    assert list(piper.synthesize("   ", voice="joe")) == []


def test_round_trip_through_whisper(piper: PiperTts, asr: WhisperAsr) -> None:
    text = "Please remind me to buy some fresh bread on the way home."
    audio = to_16k(list(piper.synthesize(text, voice="joe")), piper.sample_rate)
    result = asr.transcribe(audio)
    assert wer(text, result.text) <= 0.15, result.text


def test_concurrent_synthesis(piper: PiperTts) -> None:
    texts = ["One, two, three, four, five.", "Six, seven, eight, nine, ten."] * 2
    with ThreadPoolExecutor(max_workers=2) as pool:
        outputs = list(pool.map(lambda t: list(piper.synthesize(t, voice="joe")), texts))
    assert all(out and all(c.size for c in out) for out in outputs)

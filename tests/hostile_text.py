"""Generated hostile text for TTS, each class at the default limit (limits.max_text_chars,
4,000 characters): what made piper grow by gigabytes before pieces were bounded."""

from __future__ import annotations

import random

MAX_CHARS = 4_000
_WORDS = "the train to boston leaves at nine and we should all be there on time".split()


def _fill(unit: str, size: int = MAX_CHARS) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def _plain_words(size: int = MAX_CHARS) -> str:
    pick = random.Random(28)
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < size:
        out.append(pick.choice(_WORDS))
    return " ".join(out)[:size].strip()


def _controls(size: int = MAX_CHARS) -> str:
    pick = random.Random(29)
    junk = [chr(c) for c in range(32)] + ["\x7f", "\u200b", "\u200d", "\u202e", "\ufeff", "\u2028"]
    return "".join(w + pick.choice(junk) for w in _plain_words(size).split())[:size]


HOSTILE: dict[str, str] = {
    "digits_and_commas": _fill("1,234,567,890,"),  # one "word" of spoken numbers
    "no_punctuation": _plain_words(),  # ~800 words, no full stop
    "one_long_word": _fill("supercalifragilistic"),
    "digits_only": _fill("7"),
    "emoji": _fill("😀🎉👨‍👩‍👧🇺🇸❤️"),
    "mixed_scripts": _fill("Hello мир 世界 مرحبا שלום नमस्ते γειά ", MAX_CHARS),
    "control_characters": _controls(),
}
DIGITS_REQUEST = _fill("1,234,567,890,", 3_500)  # the 3.5 KB request that took a server down

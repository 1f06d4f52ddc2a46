"""Text preparation for TTS on generated text: whatever comes in, no engine is given more
than a bounded piece (characters, and piper's phonemes per model call), nothing speakable is
lost at the cuts, cuts fall between clauses or words whenever the piece had room for one,
and the speakable test and clean-up leave no control or invisible character behind."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from voxserve.engines.piper_tts import (
    MAX_PHONEME_IDS,
    cut_phonemes,
    phonemes_per_call,
    split_text,
)
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.synthesis.request import check_text
from voxserve.speakable import clean_text, is_speakable
from voxserve.text import MAX_PIECE_CHARS, bounded_pieces, cut_to_length

# Words of every kind hostile text is made of, joined by spaces, punctuation or nothing.
words = st.one_of(
    st.text(alphabet="abcdefghij", min_size=1, max_size=12),
    st.text(alphabet="0123456789,.", min_size=1, max_size=30),  # "1,234,567,890"
    st.text(min_size=1, max_size=40),  # any code points: scripts, emoji, controls, marks
    st.just("a" * 450),  # one word longer than a piece
    st.just("😀👨‍👩‍👧" * 30),
)
separators = st.sampled_from([" ", "  ", ", ", "; ", " — ", "-", "\n", "\t", "", ". ", "! "])
texts = st.lists(st.tuples(words, separators), max_size=40).map(
    lambda parts: "".join(word + sep for word, sep in parts)
)
bounds = st.integers(min_value=1, max_value=300)


def _ink(text: str) -> str:
    """The characters that are not white space, in order: what a cut must keep."""
    return "".join(text.split())


@given(texts, bounds)
@example("1,234,567,890," * 300, MAX_PIECE_CHARS)
@example("word " * 800, MAX_PIECE_CHARS)
@example("x" * 4000, MAX_PIECE_CHARS)
@example("e\u0301" * 300, 200)  # a combining mark stays with its letter
def test_pieces_are_bounded_and_keep_every_character(text: str, bound: int) -> None:
    pieces = cut_to_length(text, bound)
    assert all(0 < len(piece) <= bound for piece in pieces)
    assert all(piece == piece.strip() for piece in pieces)
    assert _ink("".join(pieces)) == _ink(text)


@given(texts, bounds)
@example("Well, if you want to get there, take the second road on the left " * 5, 100)
def test_cuts_fall_at_clause_ends_then_word_breaks_when_one_fits(text: str, bound: int) -> None:
    rest = text.strip()
    for piece in cut_to_length(text, bound)[:-1]:
        assert rest.startswith(piece)
        after = rest[len(piece) :]
        last = min(bound, len(rest) - 1)
        if any(rest[i] in ",;:" and rest[i + 1].isspace() for i in range(1, last)):
            assert piece[-1] in ",;:—–-", (piece, after[:10])  # at a clause end
        if any(char.isspace() for char in rest[1 : bound + 1]):
            assert after[:1].isspace() or piece[-1] in "—–", (piece, after[:10])  # a word's end
        rest = after.lstrip()


@given(texts, bounds)
def test_every_sentence_piece_is_bounded(text: str, bound: int) -> None:
    assert all(0 < len(piece) <= bound for piece in bounded_pieces(text, bound))


@given(texts)
@example("1,234,567,890," * 300)
def test_piper_pieces_are_bounded(text: str) -> None:
    assert all(len(piece) <= MAX_PIECE_CHARS for piece in split_text(text))
    assert all(len(piece) <= 50 for piece in split_text(text, max_chars=50))


phonemes = st.lists(st.sampled_from(["a", "b", "ˈ", "ɪ", " ", ",", ".", "ŋ"]), max_size=900)


@given(phonemes, st.integers(min_value=1, max_value=200))
@example(["w", "ʌ", "n", ",", " "] * 200, 78)
def test_phoneme_runs_are_bounded_and_keep_every_phoneme(ph: list[str], most: int) -> None:
    runs = cut_phonemes(ph, most)
    assert all(0 < len(run) <= most for run in runs)
    assert [p for run in runs for p in run if p != " "] == [p for p in ph if p != " "]
    for run in runs[:-1]:
        assert run[0] != " "


@given(st.floats(min_value=0.25, max_value=4.0))
def test_a_model_call_stays_within_its_ids_at_every_speed(speed: float) -> None:
    most = phonemes_per_call(MAX_PHONEME_IDS, speed)
    assert 1 <= most and 2 * most + 3 <= MAX_PHONEME_IDS
    assert most <= phonemes_per_call(MAX_PHONEME_IDS, 1.0) * min(1.0, speed) + 1


@given(st.text(max_size=200))
@example("\u200b\u200c\u200d\ufeff")
@example("....")
@example("\x00\x01\x1b[31m")
@example("\ud800")
def test_clean_text_leaves_no_control_or_invisible_character(text: str) -> None:
    cleaned = clean_text(text)
    assert all(unicodedata.category(char)[0] != "C" or char == " " for char in cleaned)
    assert _ink(cleaned) == "".join(c for c in _ink(text) if unicodedata.category(c)[0] != "C")


@given(st.text(alphabet=st.characters(categories=["P", "Z", "C", "M"]), max_size=60))
def test_punctuation_spaces_and_invisibles_alone_are_not_speakable(text: str) -> None:
    said = "".join(char for char in text if char not in "#%&*@/\\§¶")  # read out as words
    assert not is_speakable(clean_text(said))


@given(st.text(max_size=60), st.characters(categories=["L", "N"]), st.text(max_size=60))
def test_a_letter_or_digit_is_speakable(before: str, char: str, after: str) -> None:
    assert is_speakable(clean_text(before + char + after))


@given(st.text(max_size=300))
@example("....")
@example("\u200b" * 10)
@example("\x00 Hello \x07there\x1b")
def test_check_text_cleans_or_refuses_with_a_code(text: str) -> None:
    try:
        checked = check_text(text, 200)
    except VoxError as exc:
        assert exc.code in (ErrorCode.EMPTY_TEXT, ErrorCode.TEXT_TOO_LONG)
        return
    assert checked == checked.strip() and is_speakable(checked)
    assert not any(unicodedata.category(char)[0] == "C" for char in checked)


@pytest.mark.parametrize(
    "text", ["....", "?!", "…", "\u200b\u200d\u2060", "\x00\x01\x02", " \u3000 ", "( ) [ ]"]
)
def test_nothing_speakable_is_empty_text(text: str) -> None:
    with pytest.raises(VoxError) as caught:
        check_text(text, 4000)
    assert caught.value.code is ErrorCode.EMPTY_TEXT


def test_controls_inside_text_become_spaces() -> None:
    assert check_text("Hello\x00there\u200b friend\x1b", 4000) == "Hello there friend"

"""What an engine can say: the one clean-up of text before any engine sees it, and the one
test of "nothing to speak" (`empty_text`), used by every transport through
pipeline/synthesis.check_text.

Clean-up: control characters (Unicode Cc: tab, newline, NUL, escape, ...) and the line and
paragraph separators (Zl, Zp) become spaces, since inside a sentence they separate words.
Every other "other" character is removed: format characters (Cf: zero-width spaces and
joiners, bidi marks, soft hyphens, byte-order marks, tag characters), lone surrogates (Cs:
they cannot even be encoded for espeak), private-use (Co) and unassigned (Cn) code points.
None of them has a sound.

Speakable: what is left has a letter, a digit or a symbol (Unicode L*, N*, S*: emoji and
currency signs are read out), or one of the punctuation marks the espeak-based voices read
out as words (# % & * @ / \\ § ¶). Punctuation and white space alone ("....", "?!", "( )")
are not speakable. The test is by category, so a few symbols pass it that a voice still says
nothing for ("^" on piper): the one-shot transports also answer `empty_text` when the engine
made no audio at all (pipeline/synthesis.first_audio).
"""

from __future__ import annotations

import re
import unicodedata

_SPACED = frozenset(("Cc", "Zl", "Zp"))  # separate words: become one space
_READ_OUT = frozenset("#%&*@/\\§¶")  # punctuation (Po) the espeak-based voices say as words
_ASCII_CONTROLS = re.compile(r"[\x00-\x1f\x7f]")


def clean_text(text: str) -> str:
    """`text` with control characters as spaces and format and other soundless code points
    removed (module docstring); ASCII text only has its controls replaced."""
    if text.isascii():
        return _ASCII_CONTROLS.sub(" ", text)
    out: list[str] = []
    for char in text:
        if char.isascii():
            out.append(" " if _ASCII_CONTROLS.match(char) else char)
            continue
        category = unicodedata.category(char)
        if category in _SPACED:
            out.append(" ")
        elif category[0] != "C":
            out.append(char)
    return "".join(out)


def is_speakable(text: str) -> bool:
    """Whether cleaned `text` has anything a voice would say (module docstring)."""
    return any(_speakable_char(char) for char in text)


def _speakable_char(char: str) -> bool:
    if char.isalnum():  # the common case: letters and digits (L*, N*)
        return True
    return unicodedata.category(char)[0] in "LNS" or char in _READ_OUT


def says_something(text: str) -> bool:
    """Whether raw `text` is speakable once cleaned: a streamed sentence that is not ("...")
    is skipped rather than refused."""
    return is_speakable(clean_text(text))

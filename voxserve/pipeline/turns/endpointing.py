"""Semantic end of turn: how much silence ends this turn, from what was said and how.

Pure rules, no model: the transcript decoded at a tentative end (a short pause) says
whether the user sounds done. A complete sentence or question ends soon; a trailing "and",
"so", "um", a preposition, a number being read or a list still going on waits longer.
The energy of the last words (a voice trailing off ends sooner) and the session's history
(turns it ended too early: the user spoke again within a second) move the wait. Eagerness
follows OpenAI's `semantic_vad`: high answers soonest, low waits longest, auto answers a
complete sentence as soon as high and anything else as medium, and learns from the session.

The word lists are English. Another language (the decode's detected or the session's) is
judged by its punctuation only: a question or exclamation ends soon, a trailing comma waits,
anything else gets the neutral wait (about server_vad's), never the "continues" one that
English rules would give text in which they find no English word.

Why rules and not a model: the one small end-of-turn model with its weights in a registry
package (smart-turn v3.2, an 8.7 MB ONNX file inside `pipecat-ai`) was tried on the turn
fixtures (tests/fixtures/turns/) and judged them backwards where it matters: "Can you book a
table for" at its pause 0.97 complete, the whole question 0.04; it costs ~50-130 ms a call
on this 2-core machine besides (docs/benchmarks.md, "Turn-taking over three runs").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

import numpy as np

# np.median imports numpy.ma on its first call (~0.1 s here, several times that on a busy
# machine): on the event loop, in a session's first turn, every stream would stall. Now, at
# import, with the server's start.
import numpy.ma

from voxserve.audio.pcm import Int16Array
from voxserve.events import Eagerness


class Ending(Enum):
    COMPLETE = "complete"  # a sentence or question that stands on its own
    NEUTRAL = "neutral"  # no sign either way
    CONTINUES = "continues"  # a trailing conjunction, filler, number, list, ...


# Silence (ms after speech stopped) that ends a turn, per ending and eagerness. The
# tentative end (vad.speculate_ms) comes first: the decode that judges the ending starts
# there, so COMPLETE's wait is mostly spent decoding anyway.
_WAIT_MS: dict[Eagerness, dict[Ending, int]] = {
    "high": {Ending.COMPLETE: 200, Ending.NEUTRAL: 400, Ending.CONTINUES: 800},
    "medium": {Ending.COMPLETE: 300, Ending.NEUTRAL: 550, Ending.CONTINUES: 1200},
    # auto: high's wait after a complete sentence, medium's otherwise, and it learns
    # (EARLY_TURN_S): a session whose turns it ends too early waits longer.
    "auto": {Ending.COMPLETE: 200, Ending.NEUTRAL: 550, Ending.CONTINUES: 1200},
    "low": {Ending.COMPLETE: 500, Ending.NEUTRAL: 900, Ending.CONTINUES: 2000},
}
# A last word written where the decoder weighed stopping at least this much may be a guess,
# if the words before it leave the phrase open: Whisper completes "Can you book a table for
# [pause]" as "... for it?", a whole question (tiny.en weighed stopping before "it" at
# 0.28-0.46, before the fixtures' spoken last words at 0.00-0.06; whisper_words.py).
GUESSED_LAST_WORD = 0.2
EARLY_TURN_S = 1.0  # speech this soon after a turn ended: that turn ended too early
_EARLY_STEP_MS = 120  # auto: added to COMPLETE and NEUTRAL per early end (at most 3)
_EARLY_MAX = 3

_CONTINUATION = frozenset(
    """and or but so because cause then um uh er erm ah hmm mm like with without to of for
    the a an my your our their his her its this that these those which who whom whose
    where when while if than as at in on by from into onto about over under after before
    is are was were be been am will would should could can might must shall do does did
    has have had i we he she they it's i'm we're you're let's also plus including
    such either neither nor not very really just more less most some any every each""".split()
)
_NUMBER_WORDS = frozenset(
    """zero oh one two three four five six seven eight nine ten eleven twelve thirteen
    fourteen fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty
    seventy eighty ninety hundred thousand million point dot dash""".split()
)
# A turn of two words or less that begins so is a start, not a whole turn.
_OPENERS = frozenset("so well and but because actually anyway basically um uh er like".split())
_GREETINGS = frozenset("hello hi hey okay ok oh alright right".split())
_ANSWERS = frozenset("yes no yeah nope sure thanks thank you okay ok please bye goodbye".split())
_WORD = re.compile(r"[a-z0-9']+")
_TRAILING = (",", ";", ":", "-", "...", "…")
_DIGITS_AT_END = re.compile(r"[\d][\d\s-]*$")
_TRAILING_ANY = (*_TRAILING, "\u3001", "\uff0c", "\uff1b", "\uff1a")  # 、，；：
_ASKED_ANY = ("?", "!", "\uff1f", "\uff01")  # ？！


def ending(text: str, language: str = "en") -> Ending:
    """How `text` (a transcript, Whisper-punctuated, in `language`) ends."""
    text = text.strip()
    if not text:
        return Ending.NEUTRAL
    if not language.lower().startswith("en"):
        if text.endswith(_TRAILING_ANY):
            return Ending.CONTINUES
        return Ending.COMPLETE if text.endswith(_ASKED_ANY) else Ending.NEUTRAL
    words = _WORD.findall(text.lower())
    if not words or text.endswith(_TRAILING):
        return Ending.CONTINUES
    if words[-1] in _CONTINUATION or _reading_a_number(text, words):
        return Ending.CONTINUES
    if _list_in_progress(text):
        return Ending.CONTINUES
    if len(words) <= 2 and words[0] in _OPENERS:  # "So um" read as "So one."
        return Ending.CONTINUES
    if len(words) <= 2 and words[0] in _GREETINGS:  # "Hello, [pause] how are you?"
        return Ending.NEUTRAL
    if text.endswith(("?", "!")):
        return Ending.COMPLETE
    last = _WORD.findall(re.split(r"[.?!]\s+", text.rstrip(".?! "))[-1].lower())
    if text.endswith(".") and (len(last) > 3 or set(last) <= _ANSWERS):
        return Ending.COMPLETE  # "I need eggs." / "... eggs. Milk." may be a list: neutral
    return Ending.NEUTRAL


def _without_last_word(text: str) -> str:
    """ "Can you book a table for it?" -> "Can you book a table for"; "" for one word."""
    head, _, _ = text.strip().rstrip(".?!,;:…").rpartition(" ")
    return head.strip()


def _reading_a_number(text: str, words: list[str]) -> bool:
    """ "five five five", "555": digits read out, not yet a whole phone number (7 or more
    digits). One number word or a short number ("at three.") is an ordinary word."""
    spoken = 0
    for word in reversed(words):
        if word not in _NUMBER_WORDS:
            break
        spoken += 1
    tail = _DIGITS_AT_END.search(text.rstrip(".?!,"))
    digits = sum(c.isdigit() for c in tail.group()) if tail else 0
    if not text.endswith((".", "?", "!")) and (spoken or 0 < digits < 7):
        return True
    return 2 <= spoken < 7 or 3 <= digits < 7


def _list_in_progress(text: str) -> bool:
    """ "eggs, milk, bread." : short items after a comma in the last sentence, and no
    "and"/"or" before the last one (Whisper puts a full stop at any pause)."""
    if text.endswith("?"):
        return False
    sentence = re.split(r"[.?!]\s", text.rstrip(".?! "))[-1]
    items = [item.split() for item in sentence.split(",")]
    if len(items) < 2 or re.search(r"\b(and|or)\b", " ".join(items[-1]).lower()):
        return False
    short = all(len(item) <= 3 for item in items[1:])
    return short and (len(items) >= 3 or len(items[0]) >= 3)


def trailing_energy(audio: Int16Array, sample_rate: int) -> float:
    """RMS of the last 300 ms of speech over the utterance's median 100 ms RMS: below
    about 0.5 the voice trails off (done)."""
    step = sample_rate // 10
    if audio.size < 5 * step:
        return 1.0
    usable = audio[: audio.size - audio.size % step].astype(np.float32)
    rms = np.sqrt(np.mean(usable.reshape(-1, step) ** 2, axis=1))
    voiced = rms[rms > 0.1 * float(rms.max())]
    if voiced.size < 3:
        return 1.0
    return float(np.mean(voiced[-3:]) / max(float(np.median(voiced)), 1e-6))


@dataclass(slots=True)
class EndOfTurn:
    """One session's semantic turn detection (its eagerness and history)."""

    eagerness: Eagerness = "auto"
    early_ends: int = 0  # auto: turns that ended too early, lately

    def wait_ms(
        self,
        text: str,
        energy: float = 1.0,
        language: str = "en",
        stop_before_last_word: float | None = None,
    ) -> int:
        """The silence that ends a turn whose transcript so far is `text` (in `language`).
        A last word that the decoder nearly did not write (`stop_before_last_word`, AsrResult)
        after words that leave the phrase open is taken as a guess: the phrase continues."""
        kind = ending(text, language)
        doubt = stop_before_last_word or 0.0
        if doubt >= GUESSED_LAST_WORD and kind is not Ending.CONTINUES:
            rest = _without_last_word(text)
            if rest and ending(rest, language) is Ending.CONTINUES:
                kind = Ending.CONTINUES
        wait = _WAIT_MS[self.eagerness][kind]
        if kind is Ending.CONTINUES:
            return wait
        if energy < 0.5:  # trailing off: sooner
            wait = int(wait * 0.85)
        if self.eagerness == "auto":
            wait += _EARLY_STEP_MS * self.early_ends
        return wait

    @property
    def longest_ms(self) -> int:
        """The wait while nothing is known of the text (its decode not back yet)."""
        return _WAIT_MS[self.eagerness][Ending.CONTINUES]

    def ended(self, early: bool) -> None:
        """A turn ended; `early`: the user spoke again within EARLY_TURN_S of its end."""
        if early:
            self.early_ends = min(self.early_ends + 1, _EARLY_MAX)
        elif self.early_ends:
            self.early_ends -= 1

"""Two responders that need no model: `echo` (predictable, for tests and load tests) and
`rules` (a small regex-driven assistant, the default for demos).

Both stream their reply one sentence at a time so TTS can start on the first sentence
while the rest is still being produced, exactly as it would with an LLM.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from voxserve import __version__
from voxserve.text import sentence_pieces
from voxserve.types import EngineInfo


def _info(name: str, model: str = "") -> EngineInfo:
    """A responder built into voxserve (its package, version and licence)."""
    return EngineInfo("responder", name, "voxserve", __version__, "Apache-2.0", model)


class EchoResponder:
    """Replies with exactly the user's text, so tests can predict every reply."""

    fork_safe = True  # starts no thread of its own: works in a forked child (engines/base.py)

    info: EngineInfo

    def __init__(self) -> None:
        self.info = _info("echo")

    async def respond(
        self, text: str, history: Sequence[tuple[str, str]]
    ) -> AsyncGenerator[str, None]:
        """Yield the text unchanged, as one piece; nothing for empty text."""
        if text:
            yield text


# --- words for numbers, times and dates (TTS reads words more reliably than "15:45") ----

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = dict(enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2))
_ORDINAL_ONES = (
    "zeroth first second third fourth fifth sixth seventh eighth ninth tenth eleventh "
    "twelfth thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth"
).split()
_ORDINAL_TENS = {2: "twentieth", 3: "thirtieth"}
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = (
    "January February March April May June July August September October November December"
).split()


def number_words(n: int) -> str:
    """0..99 in words: 42 -> "forty-two"."""
    if not 0 <= n < 100:
        raise ValueError("number_words handles 0..99")
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")


def ordinal_words(n: int) -> str:
    """1..31 as an ordinal in words: 21 -> "twenty-first"."""
    if not 1 <= n <= 31:
        raise ValueError("ordinal_words handles 1..31")
    if n < 20:
        return _ORDINAL_ONES[n]
    tens, ones = divmod(n, 10)
    if ones == 0:
        return _ORDINAL_TENS[tens]
    return f"{_TENS[tens]}-{_ORDINAL_ONES[ones]}"


def _period(hour: int) -> str:
    if hour < 5 or hour >= 22:
        return "at night"
    if hour < 12:
        return "in the morning"
    if hour < 18:
        return "in the afternoon"
    return "in the evening"


def _hour_name(hour: int, *, noon: bool = True) -> str:
    """Name of the hour for "past"/"to" phrasing; noon and midnight need no period."""
    if hour == 0:
        return "midnight"
    if hour == 12 and noon:
        return "noon"
    return f"{number_words(hour % 12 or 12)} {_period(hour)}"


def time_in_words(moment: datetime) -> str:
    """The clock time as spoken: "a quarter past three in the afternoon"."""
    hour, minute = moment.hour, moment.minute
    if minute == 0:
        if hour in (0, 12):
            return _hour_name(hour)
        return f"{number_words(hour % 12)} o'clock {_period(hour)}"
    if minute in (15, 30):
        phrase = "a quarter past" if minute == 15 else "half past"
        return f"{phrase} {_hour_name(hour, noon=False)}"  # not "half past noon"
    if minute == 45:
        return f"a quarter to {_hour_name((hour + 1) % 24)}"
    hour12 = hour % 12 or 12
    minutes = f"oh {number_words(minute)}" if minute < 10 else number_words(minute)
    return f"{number_words(hour12)} {minutes} {_period(hour)}"


def date_in_words(moment: datetime) -> str:
    """The date as spoken: "Tuesday, the fourteenth of May"."""
    return (
        f"{_DAYS[moment.weekday()]}, the {ordinal_words(moment.day)} of {_MONTHS[moment.month - 1]}"
    )


# --- rules -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    """A pattern (searched case-insensitively) and the reply template it triggers.

    Templates may use {text}, {time}, {date}, {day}, {month}, {year}, numbered groups
    ({1}) and named groups ({what}) of the pattern. Unknown placeholders stay as written.
    """

    pattern: re.Pattern[str]
    reply: str


def _rule(pattern: str, reply: str) -> Rule:
    return Rule(re.compile(pattern, re.IGNORECASE), reply)


BUILTIN_RULES: tuple[Rule, ...] = (
    # first, so "repeat after me what time is it" repeats rather than answers
    _rule(r"\brepeat after me\b[\s,:;.!-]*(?P<what>\S.*)", "{what}"),
    _rule(
        r"\bwhat(?:'s| is)? the time\b|\bwhat time is it\b|\btell me the time\b"
        r"|\bcurrent time\b|\bdo you (?:know|have) the time\b",
        "It's {time}.",
    ),
    _rule(
        r"\bwhat(?:'s| is)? (?:the|today's) date\b|\bwhat date is (?:it|today)\b"
        r"|\btoday's date\b",
        "Today is {date}.",
    ),
    _rule(
        r"\bwhat day is (?:it|today)\b|\bwhat(?:'s| is) the day\b|\bwhich day is (?:it|today)\b"
        r"|\bwhat day of the week\b",
        "Today is {day}.",
    ),
    _rule(
        r"\bhow are you\b|\bhow's it going\b|\bhow are things\b|\bhow do you do\b",
        "I'm doing well, thank you. How can I help?",
    ),
    _rule(
        r"\bwho are you\b|\bwhat(?:'s| is) your name\b|\bwhat are you\b",
        "I'm a voice assistant served by voxserve. "
        "I can tell you the time or the date, and repeat what you say.",
    ),
    _rule(
        r"^\W*help\b|\bwhat can you do\b|\bhelp me\b|\bi need (?:some )?help\b",
        "You can ask me what time it is, or what day it is. "
        "Say repeat after me, followed by some words, and I'll say them back. "
        "For anything else, I'll tell you what I heard.",
    ),
    _rule(r"\bthanks?\b|\bthank you\b|\bcheers\b", "You're welcome!"),
    _rule(r"\b(?:good ?bye|bye|see you(?: later)?)\b", "Goodbye!"),
    _rule(
        r"^\W*(?:hi|hello|hey|hiya|howdy|greetings|good (?:morning|afternoon|evening))\b",
        "Hello! How can I help you?",
    ),
)

DEFAULT_FALLBACK = "I heard: {text}."

_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_TRAILING_PUNCT = re.compile(r"[\s.!?]+$")


def load_rules(path: str | Path) -> list[Rule]:
    """Read a JSON list of {"pattern": ..., "reply": ...}; errors name the file and entry."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read rules file {str(path)!r}: {exc.strerror}") from exc
    except ValueError as exc:
        raise ValueError(f"rules file {str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(raw, list):
        raise ValueError(f"rules file {str(path)!r} must hold a JSON list of rules")
    rules: list[Rule] = []
    for index, entry in enumerate(raw):
        where = f"rules file {str(path)!r}, rule {index}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object with 'pattern' and 'reply'")
        pattern, reply = entry.get("pattern"), entry.get("reply")
        if not isinstance(pattern, str) or not isinstance(reply, str):
            raise ValueError(f"{where}: 'pattern' and 'reply' must both be strings")
        try:
            rules.append(_rule(pattern, reply))
        except re.error as exc:
            raise ValueError(f"{where}: invalid pattern: {exc}") from exc
    return rules


def _fill(template: str, values: Mapping[str, str]) -> str:
    """Substitute {name} placeholders without str.format, so templates from a rules file
    cannot reach attributes or raise on stray braces."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


class RulesResponder:
    """Ordered regex rules -> reply templates; the first match wins, else the fallback.

    Rules from `rules_file` are tried before the built-in ones, so they can both add new
    replies and override built-in ones. `now` supplies the clock (local time by default),
    which keeps time and date replies testable.
    """

    fork_safe = True  # starts no thread of its own: works in a forked child (engines/base.py)

    info: EngineInfo

    def __init__(
        self,
        *,
        rules_file: str | None = None,
        builtin_rules: bool = True,
        fallback: str = DEFAULT_FALLBACK,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        custom = load_rules(rules_file) if rules_file else []
        self.rules: tuple[Rule, ...] = (*custom, *(BUILTIN_RULES if builtin_rules else ()))
        self.fallback = fallback
        self._now = now or datetime.now
        self.info = _info("rules", "builtin" if not custom else f"builtin+{len(custom)}")

    def reply(self, text: str) -> str:
        """The whole reply for one utterance ("" for empty text)."""
        text = text.strip().replace("\u2019", "'")
        if not text:
            return ""
        values = self._values(text)
        for rule in self.rules:
            match = rule.pattern.search(text)
            if match is None:
                continue
            groups = {str(i): g or "" for i, g in enumerate(match.groups(), start=1)}
            named = {k: v or "" for k, v in match.groupdict().items()}
            return _fill(rule.reply, {**values, **groups, **named}).strip()
        return _fill(self.fallback, values).strip()

    async def respond(
        self, text: str, history: Sequence[tuple[str, str]]
    ) -> AsyncGenerator[str, None]:
        """Yield the reply one sentence at a time, each with the space after it, so the pieces
        join to `reply(text)` (as with the LLM responder)."""
        for sentence in sentence_pieces(self.reply(text)):
            yield sentence

    def _values(self, text: str) -> dict[str, str]:
        moment = self._now()
        return {
            "text": _TRAILING_PUNCT.sub("", text),
            "time": time_in_words(moment),
            "date": date_in_words(moment),
            "day": _DAYS[moment.weekday()],
            "month": _MONTHS[moment.month - 1],
            "year": str(moment.year),
        }

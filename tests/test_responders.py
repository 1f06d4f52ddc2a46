"""EchoResponder and RulesResponder: predictable replies, streamed one sentence at a time."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from pathlib import Path

import pytest

import voxserve
from voxserve.engines.base import Responder
from voxserve.engines.responders import (
    EchoResponder,
    RulesResponder,
    date_in_words,
    number_words,
    ordinal_words,
    time_in_words,
)

MOMENT = datetime(2024, 5, 14, 15, 45)  # a Tuesday


async def collect(pieces: AsyncIterator[str]) -> list[str]:
    return [piece async for piece in pieces]


def rules(**options: object) -> RulesResponder:
    return RulesResponder(now=lambda: MOMENT, **options)  # type: ignore[arg-type]


async def reply_pieces(
    responder: Responder, text: str, history: Sequence[tuple[str, str]] = ()
) -> list[str]:
    return await collect(responder.respond(text, history))


def test_both_satisfy_the_protocol_and_describe_themselves() -> None:
    for responder, name in ((EchoResponder(), "echo"), (rules(), "rules")):
        assert isinstance(responder, Responder)
        info = responder.info
        assert (info.kind, info.name) == ("responder", name)
        assert (info.package, info.version, info.license) == (
            "voxserve",
            voxserve.__version__,
            "Apache-2.0",
        )


def test_constructors_take_keywords_only() -> None:
    with pytest.raises(TypeError):
        RulesResponder("rules.json")  # type: ignore[misc]


async def test_echo_yields_exactly_the_text() -> None:
    echo = EchoResponder()
    assert await reply_pieces(echo, "Hello there. How are you?") == ["Hello there. How are you?"]
    assert await reply_pieces(echo, "  spaced  ", [("a", "b")]) == ["  spaced  "]
    assert await reply_pieces(echo, "") == []


@pytest.mark.parametrize(
    ("text", "reply"),
    [
        ("Hello!", "Hello! How can I help you?"),
        ("good evening", "Hello! How can I help you?"),
        ("What time is it?", "It's a quarter to four in the afternoon."),
        ("hey, what's the time", "It's a quarter to four in the afternoon."),
        ("What\u2019s the date today?", "Today is Tuesday, the fourteenth of May."),
        ("what day is it", "Today is Tuesday."),
        ("Thank you.", "You're welcome!"),
        ("thanks a lot", "You're welcome!"),
        ("Who are you?", None),
        ("how are you doing", "I'm doing well, thank you. How can I help?"),
        ("Help", None),
        ("Repeat after me: the cat sat on the mat.", "the cat sat on the mat."),
        ("repeat after me what time is it", "what time is it"),
        ("Okay bye", "Goodbye!"),
        ("The weather is nice.", "I heard: The weather is nice."),
        ("turn on the lights!?", "I heard: turn on the lights."),
    ],
)
def test_rules_reply(text: str, reply: str | None) -> None:
    answer = rules().reply(text)
    if reply is None:
        assert answer and not answer.startswith("I heard")
    else:
        assert answer == reply


def test_empty_text_gets_no_reply() -> None:
    assert rules().reply("   ") == ""


async def test_rules_stream_one_piece_per_sentence() -> None:
    pieces = await reply_pieces(rules(), "how are you?")
    assert pieces == ["I'm doing well, thank you. ", "How can I help?"]
    help_pieces = await reply_pieces(rules(), "help")
    assert len(help_pieces) == 3
    assert "".join(help_pieces) == rules().reply("help")
    assert await reply_pieces(rules(), "   ") == []


def test_replies_are_deterministic_given_the_clock() -> None:
    first, second = rules(), rules()
    for text in ("what time is it", "hello", "something else"):
        assert first.reply(text) == second.reply(text) == first.reply(text)


def test_rules_file_extends_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "rules.json"
    path.write_text(
        json.dumps(
            [
                {"pattern": r"^hello\b", "reply": "Ahoy! Welcome aboard."},
                {"pattern": r"\bweather in (?P<city>\w+)", "reply": "No forecast for {city}."},
                {"pattern": r"\bmy name is (\w+)", "reply": "Nice to meet you, {1}. {unknown}"},
                {"pattern": r"\bclock\b", "reply": "{time} on {day}, {month} {year}."},
            ]
        )
    )
    responder = rules(rules_file=str(path))
    assert responder.reply("Hello there") == "Ahoy! Welcome aboard."  # overrides builtin
    assert responder.reply("hi there") == "Hello! How can I help you?"  # builtins remain
    assert responder.reply("what's the weather in Paris") == "No forecast for Paris."
    assert responder.reply("my name is Ada") == "Nice to meet you, Ada. {unknown}"
    assert responder.reply("clock") == "a quarter to four in the afternoon on Tuesday, May 2024."
    assert responder.info.model == "builtin+4"


def test_builtin_rules_can_be_switched_off_and_fallback_changed(tmp_path: Path) -> None:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps([{"pattern": "ping", "reply": "pong"}]))
    responder = rules(rules_file=str(path), builtin_rules=False, fallback="Sorry?")
    assert responder.reply("ping") == "pong"
    assert responder.reply("what time is it") == "Sorry?"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"pattern": "a", "reply": "b"}', "JSON list"),
        ('["x"]', "rule 0"),
        ('[{"pattern": "a"}]', "must both be strings"),
        ('[{"pattern": "(", "reply": "b"}]', "invalid pattern"),
    ],
)
def test_bad_rules_file_is_rejected_clearly(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "rules.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        RulesResponder(rules_file=str(path))


def test_missing_rules_file() -> None:
    with pytest.raises(ValueError, match="cannot read rules file"):
        RulesResponder(rules_file="/nonexistent/rules.json")


def test_template_cannot_reach_attributes(tmp_path: Path) -> None:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps([{"pattern": "x", "reply": "{text.__class__} {0} {"}]))
    assert rules(rules_file=str(path)).reply("x") == "{text.__class__} {0} {"


@pytest.mark.parametrize(
    ("hour", "minute", "words"),
    [
        (0, 0, "midnight"),
        (12, 0, "noon"),
        (13, 0, "one o'clock in the afternoon"),
        (9, 5, "nine oh five in the morning"),
        (0, 15, "a quarter past midnight"),
        (12, 30, "half past twelve in the afternoon"),
        (11, 45, "a quarter to noon"),
        (23, 45, "a quarter to midnight"),
        (18, 22, "six twenty-two in the evening"),
        (2, 59, "two fifty-nine at night"),
    ],
)
def test_time_in_words(hour: int, minute: int, words: str) -> None:
    assert time_in_words(datetime(2024, 1, 1, hour, minute)) == words


def test_numbers_and_dates_in_words() -> None:
    assert [number_words(n) for n in (0, 13, 40, 42, 88, 99)] == [
        "zero",
        "thirteen",
        "forty",
        "forty-two",
        "eighty-eight",
        "ninety-nine",
    ]
    assert [ordinal_words(n) for n in (1, 2, 3, 12, 20, 21, 30, 31)] == [
        "first",
        "second",
        "third",
        "twelfth",
        "twentieth",
        "twenty-first",
        "thirtieth",
        "thirty-first",
    ]
    assert date_in_words(datetime(2025, 1, 1)) == "Wednesday, the first of January"

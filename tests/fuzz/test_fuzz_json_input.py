"""The one decoder of client JSON (`server/session/json_input.py`): its depth measure agrees with a
JSON lexer, refusals come before the parser ever runs, and whatever it returns can be
encoded again."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz.strategies import any_text, assert_safe, hostile_values, outcome_of, utf8
from voxserve.errors import ErrorCode, VoxError
from voxserve.server.session import json_input
from voxserve.server.session.json_input import decode_json, too_deep

LIMIT = 32
MAX = 256 * 1024


def lexer_depth(text: str) -> int:
    """The deepest nesting a left-to-right JSON parser reaches before the first place it
    must stop (a backslash outside a string): the reference `too_deep` must never be below."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "\\":
            break  # not JSON: the parser stops here
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def value_depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(value_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(value_depth, value.values()), default=0)
    return 0


bracket_soup = st.text(st.sampled_from('[]{}"\\ a,:1'), max_size=300)
nested_values = st.recursive(
    st.none() | st.integers() | st.text(st.sampled_from('[]{}"\\ab'), max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=60,
)


@given(bracket_soup, st.integers(0, 12))
@example('"\\\\"' + "[" * 13, 12)  # an escaped backslash ends its string: the rest nests
@example('"\\"' + "[" * 13 + '"', 12)  # an escaped quote does not: all of it is text
def test_depth_is_never_below_what_a_parser_reaches(text: str, limit: int) -> None:
    if lexer_depth(text) > limit:
        assert too_deep(text, limit)


@given(nested_values, st.integers(0, 12))
def test_depth_of_json_is_exact(value: Any, limit: int) -> None:
    text = json.dumps(value)
    assert too_deep(text, limit) == (value_depth(value) > limit)


@given(any_text | bracket_soup)
@example('{"a": "\\ud800"}')
@example('{"\\udfff": 1}')
@example('["\\ud83d\\ude00"]')  # a surrogate pair escaped: one valid character
def test_whatever_it_returns_can_be_encoded(text: str) -> None:
    for raw in (text, utf8(text)):
        assert_safe(outcome_of(decode_json, raw, max_bytes=MAX, max_depth=LIMIT, what="x"))


@given(hostile_values)
def test_hostile_values_round_trip_or_are_refused(value: Any) -> None:
    for ensure_ascii in (True, False):
        text = json.dumps(value, ensure_ascii=ensure_ascii)
        outcome = outcome_of(decode_json, text, max_bytes=MAX, max_depth=LIMIT, what="x")
        assert_safe(outcome)


@pytest.mark.parametrize("kind", ["array", "object"])
@pytest.mark.parametrize("limit", [1, 3, 32])
def test_the_limit_is_exact(kind: str, limit: int) -> None:
    def nested(depth: int) -> str:
        if kind == "array":
            return "[" * depth + "]" * depth
        return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)

    assert decode_json(nested(limit), max_bytes=MAX, max_depth=limit, what="x") is not None
    with pytest.raises(VoxError) as refused:
        decode_json(nested(limit + 1), max_bytes=MAX, max_depth=limit, what="x")
    assert refused.value.code is ErrorCode.INVALID_JSON
    assert f"deeper than {limit} levels" in refused.value.message
    in_a_string = json.dumps({"text": "[" * 5000 + "{" * 5000})
    assert decode_json(in_a_string, max_bytes=MAX, max_depth=limit, what="x")


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ('{"a": "\\ud800"}', ErrorCode.INVALID_MESSAGE),
        ('{"\\udc00": 1}', ErrorCode.INVALID_MESSAGE),
        ('{"a": ["x", {"b": "\\uDFFF"}]}', ErrorCode.INVALID_MESSAGE),
        ('{"a": "\ud800"}', ErrorCode.INVALID_MESSAGE),  # raw, in a str made elsewhere
        (b'{"a": "\xed\xa0\x80"}', ErrorCode.INVALID_JSON),  # as bytes: not UTF-8
        ('{"a": NaN}', ErrorCode.INVALID_JSON),
        ('{"a": -Infinity}', ErrorCode.INVALID_JSON),
        ('{"a": ' + "9" * 5000 + "}", ErrorCode.INVALID_JSON),
        ("[" * 100_000, ErrorCode.INVALID_JSON),
        ("x" * (MAX + 1), ErrorCode.MESSAGE_TOO_LARGE),
    ],
    ids=[
        "escape",
        "escape_in_key",
        "escape_deep",
        "raw_str",
        "raw_bytes",
        "nan",
        "infinity",
        "huge_int",
        "deep",
        "large",
    ],
)
def test_refused_with_a_code(raw: str | bytes, code: ErrorCode) -> None:
    with pytest.raises(VoxError) as refused:
        decode_json(raw, max_bytes=MAX, max_depth=LIMIT, what="control message")
    assert refused.value.code is code
    assert refused.value.message.startswith("control message")


def test_too_deep_is_refused_before_the_parser_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounded before parsing, not by catching the parser's RecursionError."""
    calls: list[str] = []
    monkeypatch.setattr(json_input, "json", SimpleNamespace(loads=calls.append))
    for text in ("[" * 2000, '{"a":' * 2000, '[1, {"b": ' * 40 + "2"):
        with pytest.raises(VoxError, match="deeper than"):
            decode_json(text, max_bytes=MAX, max_depth=LIMIT, what="x")
    assert calls == []


@pytest.mark.parametrize(
    "text",
    [
        "[" * MAX,
        "[]" * (MAX // 2),
        "]" * (MAX - 40) + "[" * 40,
        '"' + '\\"' * (MAX // 2 - 1),
        '["' + "[" * (MAX - 4) + '"]',
        '"a",' * (MAX // 4),
    ],
    ids=["open", "pairs", "closing_first", "unterminated", "brackets_in_a_string", "quotes"],
)
def test_the_worst_256_kib_is_refused_in_linear_time(text: str) -> None:
    """A few milliseconds each here; a quadratic scan (a regex restarted at every quote)
    would take minutes."""
    started = time.perf_counter()
    outcome_of(decode_json, text, max_bytes=MAX, max_depth=LIMIT, what="x")
    assert time.perf_counter() - started < 0.5

"""Hostile input for every wire parser, as hypothesis strategies, and the property each must
keep (`assert_safe`).

The classes that reached clients as `internal` errors, 5xx or dropped connections (issue 28,
docs/reliability.md "Hostile JSON"): lone surrogates (as `\\ud800` escapes, as raw
characters in a str, as UTF-8-encoded bytes), nesting far past the parser's recursion
limit, huge numbers, NaN and Infinity, very long strings (echoed into error messages),
control characters. `json_values` mixes them into ordinary JSON values; `json_documents`
turns a message strategy into raw text with these classes spliced in (nesting and number
literals that json.dumps cannot write).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import strategies as st

from voxserve.errors import VoxError
from voxserve.server.grpc.codec import MAX_DETAILS

SURROGATES = ["\ud800", "\udfff", "\udc00", "\ud83d", "a\ud800b", "\ud800\ud800"]
CONTROL = ["\x00", "\x07", "\x1b[2J", "\u0085", "\u2028", "\ufeff", "\ufffe", "\U0010ffff"]

# Any code point: surrogates (category Cs) and control characters included.
any_text = st.text(st.characters(exclude_categories=()), max_size=40)
long_text = st.integers(1_000, 30_000).map(lambda n: "v" * n)
hostile_text = st.sampled_from(SURROGATES + CONTROL) | any_text | long_text
huge_numbers = (
    st.integers(min_value=2**63, max_value=10**400)
    | st.integers(max_value=-(2**63), min_value=-(10**400))
    | st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308, -0.0, 5e-324])
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
hostile_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | hostile_text | huge_numbers,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
    max_leaves=12,
)


def field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: a valid one, hostile text, or any hostile JSON value (a third each,
    so every string field of a message is hostile often enough to be found)."""
    return valid | hostile_text | hostile_values


# Raw JSON text a field's value may be replaced with: nothing json.dumps would write.
deep_nesting = st.builds(
    lambda depth, kind, closed: (
        ("[" * depth + "]" * depth if closed else "[" * depth)
        if kind == "array"
        else ('{"a":' * depth + "1" + "}" * depth if closed else '{"a":' * depth)
    ),
    st.integers(33, 3_000),
    st.sampled_from(["array", "object"]),
    st.booleans(),
)
raw_literals = (
    deep_nesting
    | st.integers(300, 6_000).map(lambda digits: "9" * digits)  # past int()'s 4,300 digits
    | st.sampled_from(["NaN", "Infinity", "-Infinity", "1e99999", '"\\ud800"', '"\\udfff x"'])
)
_PLACEHOLDER = "__voxserve_fuzz_raw__"


@st.composite
def json_documents(draw: st.DrawFn, messages: st.SearchStrategy[dict[str, Any]]) -> str:
    """A message as JSON text: escaped (json.dumps writes a lone surrogate as `\\ud800`),
    with raw characters (ensure_ascii off: a raw surrogate stays in the str), or with one
    field's value replaced by a raw literal (deep nesting, a huge number, NaN, an escape)."""
    message = draw(messages)
    way = draw(st.sampled_from(["escaped", "raw", "spliced"]))
    if way == "spliced" and message:
        field = draw(st.sampled_from(sorted(message)))
        message = {**message, field: _PLACEHOLDER}
        text = json.dumps(message, allow_nan=True)
        return text.replace(json.dumps(_PLACEHOLDER), draw(raw_literals), 1)
    return json.dumps(message, ensure_ascii=way == "escaped", allow_nan=True)


def utf8(text: str) -> bytes:
    """What a client sends: UTF-8, a raw surrogate encoded as its 3 bytes (not valid UTF-8)."""
    return text.encode("utf-8", "surrogatepass")


def assert_safe(outcome: object) -> None:
    """The property every parser keeps: what it returns holds only text that can be
    encoded (an event, a reply or a cache key made from it can be written), and a refusal
    is a VoxError whose message is short and encodable (error events, HTTP bodies, gRPC
    trailing metadata)."""
    if isinstance(outcome, VoxError):
        assert len(outcome.message) <= MAX_DETAILS, outcome.message[:200]
        outcome.message.encode("utf-8")
        return
    stack: list[object] = [outcome]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            item.encode("utf-8")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            stack.extend(getattr(item, f.name) for f in dataclasses.fields(item))


def outcome_of(call: Any, *args: Any, **kwargs: Any) -> object:
    """What a parser gives: its value, or the VoxError it raised; anything else escapes."""
    try:
        return call(*args, **kwargs)
    except VoxError as exc:
        return exc

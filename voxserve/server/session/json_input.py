"""Client JSON, decoded the one way every transport uses: WebSocket control messages, HTTP
bodies, Wyoming headers and data blocks.

`json.loads` alone trusts its input three ways that reached clients as `internal` errors
or dropped connections: it recurses once per nesting level (~1,000 nested arrays, 2 KB,
raise RecursionError), it turns a `\\ud800` escape into a str that cannot be encoded back
to UTF-8 (the reply, the cache key or the event writer then fails far from the input), and
it accepts `NaN` and `Infinity`, which are not JSON. Here the size is checked first, then
the nesting depth is measured on the raw text without recursion, and only then is the text
parsed; every decoded string (keys too) must be encodable.

Codes: over the size `message_too_large`; not UTF-8, not JSON, too deep `invalid_json`;
text that is not valid Unicode (a lone surrogate) `invalid_message`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from voxserve.errors import ErrorCode, VoxError

DEFAULT_MAX_DEPTH = 32
"""limits.max_json_depth: far above any message of the protocols (Wyoming's are 3 deep)."""

# Brackets as +1 (open) and -1 (0xFF as int8, close); every other byte deleted.
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[{]}"))
# A lone surrogate can only come from a \uD800-\uDFFF escape (the text itself is checked).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def decode_json(raw: str | bytes, *, max_bytes: int, max_depth: int, what: str) -> Any:
    """The JSON value of `raw`, every string in it encodable; VoxError otherwise. `what`
    names the input in messages ("control message", "request body")."""
    text = _text(raw, max_bytes, what)
    value = _parse(text, max_depth, what)
    if _SURROGATE_ESCAPE.search(text) is not None:
        check_encodable(value, what)
    return value


def parse_json(raw: str | bytes, *, max_bytes: int, max_depth: int, what: str) -> Any:
    """`decode_json` without the check of decoded strings, for a reader that must finish
    reading a frame before it refuses what the frame says (Wyoming: `check_encodable`
    then runs on the event's fields)."""
    return _parse(_text(raw, max_bytes, what), max_depth, what)


def too_deep(text: str, limit: int) -> bool:
    """Whether arrays and objects nest deeper than `limit` in `text` (brackets in strings
    are text), found without parsing it, in C-speed passes (a 256 KiB message of brackets
    takes about a millisecond). Unbalanced brackets count as they open: what a recursive
    parser would recurse into before it found the error."""
    if text.count("[") + text.count("{") <= limit:
        return False  # the common case: too few brackets to nest that deep
    # Escaped backslashes, then escaped quotes, go first (as a JSON lexer reads them: a
    # run of backslashes keeps its parity); then every other piece is outside a string.
    unescaped = text.replace("\\\\", "").replace('\\"', "")
    outside = "".join(unescaped.split('"')[0::2])
    steps = outside.encode("utf-8", "surrogatepass").translate(_STEPS, _NOT_BRACKETS)
    if steps.count(1) <= limit:
        return False
    depth = np.frombuffer(steps, dtype=np.int8).astype(np.int32)
    np.cumsum(depth, out=depth)
    return int(depth.max()) > limit


def _text(raw: str | bytes, max_bytes: int, what: str) -> str:
    """Within the size, as text that holds no raw surrogate."""
    if len(raw) > max_bytes:
        raise VoxError(ErrorCode.MESSAGE_TOO_LARGE, f"{what} exceeds {max_bytes} bytes")
    if isinstance(raw, str):
        if not raw.isascii():
            _check_str(raw, what)  # a str made elsewhere may hold raw surrogates
        return raw
    try:
        return raw.decode(json.detect_encoding(raw))  # strict: refuses encoded surrogates
    except UnicodeDecodeError:
        raise VoxError(ErrorCode.INVALID_JSON, f"{what} is not valid UTF-8") from None


def _parse(text: str, max_depth: int, what: str) -> Any:
    if too_deep(text, max_depth):
        raise VoxError(
            ErrorCode.INVALID_JSON,
            f"{what} nests deeper than {max_depth} levels (limits.max_json_depth)",
        )
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError):  # RecursionError: not below any sane max_depth
        raise VoxError(ErrorCode.INVALID_JSON, f"{what} is not valid JSON") from None


def as_float(value: int | float, name: str) -> float:
    """A JSON number as a float. A JSON integer may have thousands of digits, which float()
    refuses with OverflowError (a 500 before this): `invalid_parameter` instead."""
    try:
        return float(value)
    except OverflowError:
        raise VoxError(ErrorCode.INVALID_PARAMETER, f"{name} is out of range") from None


def optional_str(value: object, name: str) -> str | None:
    """A JSON body's optional string field: absent (None) or a string, else
    `invalid_parameter` naming the field."""
    if value is None or isinstance(value, str):
        return value
    raise VoxError(ErrorCode.INVALID_PARAMETER, f"{name} must be a string")


def check_encodable(value: Any, what: str) -> None:
    """Every string in a decoded value (keys too) can be encoded to UTF-8: no lone
    surrogates, which a reply, a cache key or an event writer could not encode later.
    Iterative: the value may be as deep as the depth limit allows."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                _check_str(item, what)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _check_str(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise VoxError(
            ErrorCode.INVALID_MESSAGE,
            f"{what} holds text that is not valid Unicode (a lone surrogate such as \\ud800)",
        ) from None


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


# One decoder for every message: json.loads with a keyword argument builds a new one per call.
_DECODER = json.JSONDecoder(parse_constant=_not_json)

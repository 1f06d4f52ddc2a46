"""Wyoming framing and event fields, checked without I/O, so they can be fuzzed.

A Wyoming event is one JSON header line (``type``, optional ``data``, ``data_length``,
``payload_length``), then ``data_length`` bytes of JSON merged into ``data``, then
``payload_length`` bytes of payload. The `wyoming` package's own reader trusts the header:
a header that is not an object, a length that is not a number or is huge (the server would
buffer whatever it announces), or nested JSON past the recursion limit escape it as
AttributeError, TypeError, KeyError or RecursionError, ending the connection with a
traceback. Here every such input is a VoxError with a code, the lengths are capped, and
the JSON is decoded by `json_input` (nesting bounded before parsing).

`check_event` then checks the fields the handler reads (the package's `from_event`
indexes them without checking types), so a bad field is `invalid_message`, not `internal`;
so is text that cannot be encoded (a `\\ud800` escape), refused there rather than while
reading, so the connection stays in step and goes on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from wyoming.event import Event

from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.server.session.json_input import DEFAULT_MAX_DEPTH, check_encodable, parse_json

MAX_TYPE_CHARS = 64
MAX_HEADER_BYTES = 64 * 1024 + 1  # a line and its newline: the reader's limit (asyncio's)


@dataclass(frozen=True, slots=True)
class EventHeader:
    type: str
    data: dict[str, Any]
    data_length: int
    payload_length: int


def _invalid(message: str) -> VoxError:
    return VoxError(ErrorCode.INVALID_MESSAGE, message)


def _length(header: dict[str, Any], name: str, limit: int) -> int:
    value = header.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _invalid(f"{name} must be a non-negative integer")
    if value > limit:
        raise VoxError(ErrorCode.MESSAGE_TOO_LARGE, f"{name} {quoted(value)} exceeds {limit} bytes")
    return value


def parse_header(
    line: bytes, *, max_data: int, max_payload: int, max_depth: int = DEFAULT_MAX_DEPTH
) -> EventHeader:
    """One header line as an EventHeader; VoxError for anything else."""
    # parse_json, not decode_json: the strings are checked by `check_event`, once the
    # event has been read whole and the stream is still in step.
    header = parse_json(line, max_bytes=MAX_HEADER_BYTES, max_depth=max_depth, what="event header")
    if not isinstance(header, dict):
        raise _invalid("event header must be a JSON object")
    kind = header.get("type")
    if not isinstance(kind, str) or not 0 < len(kind) <= MAX_TYPE_CHARS:
        raise _invalid(f"event type must be a string of 1-{MAX_TYPE_CHARS} characters")
    data = header.get("data")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise _invalid("event data must be a JSON object")
    return EventHeader(
        kind,
        data,
        _length(header, "data_length", max_data),
        _length(header, "payload_length", max_payload),
    )


def merge_data(
    header: EventHeader, raw: bytes, max_depth: int = DEFAULT_MAX_DEPTH
) -> dict[str, Any]:
    """The header's data updated with the separate data block (the package's rule)."""
    extra = (
        parse_json(raw, max_bytes=header.data_length, max_depth=max_depth, what="event data")
        if raw
        else {}
    )
    if not isinstance(extra, dict):
        raise _invalid("event data must be a JSON object")
    return {**header.data, **extra}


def _optional(data: dict[str, Any], name: str, kinds: tuple[type, ...]) -> None:
    value = data.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
        kind_names = " or ".join(k.__name__ for k in kinds)
        raise _invalid(f"{name} must be {kind_names}")


def _required(data: dict[str, Any], name: str, kinds: tuple[type, ...]) -> None:
    if data.get(name) is None:
        raise _invalid(f"{name} is required")
    _optional(data, name, kinds)


def _int_in(data: dict[str, Any], name: str, low: int, high: int) -> None:
    _required(data, name, (int,))
    if not low <= data[name] <= high:
        raise _invalid(f"{name} must be {low}-{high}")


def _voice(data: dict[str, Any]) -> None:
    if "voice" not in data:
        return
    voice = data["voice"]
    if not isinstance(voice, dict):  # null too: the package's decoder reads it as a dict
        raise _invalid("voice must be an object")
    for name in ("name", "language", "speaker"):
        _optional(voice, name, (str,))


def _audio(data: dict[str, Any]) -> None:
    _int_in(data, "rate", 1, 1_000_000)
    _int_in(data, "width", 1, 8)
    _int_in(data, "channels", 0, 64)
    _optional(data, "timestamp", (int, float))


def _text(data: dict[str, Any]) -> None:
    _required(data, "text", (str,))


def _transcribe(data: dict[str, Any]) -> None:
    for name in ("name", "language"):
        _optional(data, name, (str,))


def _synthesize(data: dict[str, Any]) -> None:
    _text(data)
    _voice(data)


def _detect(data: dict[str, Any]) -> None:
    names = data.get("names")
    if names is not None and (
        not isinstance(names, list) or not all(isinstance(n, str) for n in names)
    ):
        raise _invalid("names must be a list of strings")


def _ping(data: dict[str, Any]) -> None:
    _optional(data, "text", (str,))


_CHECKS = {
    "audio-start": _audio,
    "audio-chunk": _audio,
    "transcribe": _transcribe,
    "synthesize": _synthesize,
    "synthesize-start": _voice,
    "synthesize-chunk": _text,
    "ping": _ping,
    "detect": _detect,
}


def check_event(event: Event) -> None:
    """The fields the handler reads have the types it expects, and every string in an
    event it reads can be encoded (no lone surrogate: a reply or an echo of it could not
    be written); other events pass."""
    check = _CHECKS.get(event.type)
    if check is not None:
        data = event.data or {}
        check_encodable(data, f"{event.type} event")
        check(data)


async def read_event(
    reader: asyncio.StreamReader,
    *,
    max_data: int,
    max_payload: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> Event | None:
    """The next event, None at the end of the stream; VoxError when the framing is broken
    (the connection cannot be read further). A header line over the reader's limit is
    `message_too_large`."""
    try:
        line = await reader.readline()
    except ValueError:  # asyncio's LimitOverrunError: a line past the reader's limit
        raise VoxError(ErrorCode.MESSAGE_TOO_LARGE, "event header line is too long") from None
    if not line:
        return None
    header = parse_header(line, max_data=max_data, max_payload=max_payload, max_depth=max_depth)
    try:
        raw = await reader.readexactly(header.data_length) if header.data_length else b""
        payload = await reader.readexactly(header.payload_length) if header.payload_length else None
    except asyncio.IncompleteReadError:
        return None  # the peer left mid-event
    return Event(type=header.type, data=merge_data(header, raw, max_depth), payload=payload)

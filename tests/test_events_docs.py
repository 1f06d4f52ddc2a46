"""docs/protocol.md against voxserve/events.py, both ways, so the two cannot drift: every
event and client message the WebSocket section documents exists with exactly the documented
fields, and every one the module defines is documented; the gRPC section names the events
its wire does not carry.

Read from the section: the server events table (### 5: `name` | fields, optional ones in
"(+ ...)"), the `session.started` example (### 1), the `session.start` field table (### 1),
and the client messages shown as JSON (examples and the ### 4 table's first column).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest

from tests.event_samples import SAMPLES
from voxserve import events as ev
from voxserve.server.grpc import events as grpc_events
from voxserve.v1 import voxserve_pb2 as pb

PROTOCOL = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"
_NAME = re.compile(r"`([a-z_.]+)`")
_OPTIONAL = re.compile(r"\(\+([^()]*)\)")
_ASIDE = re.compile(r"\([^()]*\)")
_JSON_BLOCK = re.compile(r"```json\n(.*?)```", re.S)
_INLINE_JSON = re.compile(r"`(\{[^`]*\})`")


def websocket_section() -> str:
    text = PROTOCOL.read_text(encoding="utf-8")
    start = text.index("## WebSocket `/v1/stream`")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def subsection(number: int) -> str:
    section = websocket_section()
    start = section.index(f"### {number}.")
    end = section.find("\n### ", start + 1)
    return section[start:] if end < 0 else section[start:end]


def table_rows(text: str) -> list[list[str]]:
    """The cells of every table row, header and rule lines left out."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[1:] if rows else rows


def documented_events() -> dict[str, tuple[set[str], set[str]]]:
    """Event type -> (fields always sent, fields sent where they apply)."""
    found: dict[str, tuple[set[str], set[str]]] = {}
    for name_cell, fields_cell in table_rows(subsection(5)):
        names = _NAME.findall(name_cell)
        if not names:
            continue  # *(binary)*: reply audio, not an event
        fields = fields_cell.split(" — ")[0]
        optional = {n for group in _OPTIONAL.findall(fields) for n in _NAME.findall(group)}
        fields = _OPTIONAL.sub("", fields)
        while _ASIDE.search(fields):  # asides name values and settings, not fields
            fields = _ASIDE.sub("", fields)
        found[names[0]] = (set(_NAME.findall(fields)), optional)
    for example in json_examples():
        if example["type"] == "session.started":
            found["session.started"] = (set(example) - {"type"}, set())
    return found


def json_examples() -> list[dict[str, Any]]:
    """Every JSON object the WebSocket section shows: in ```json blocks (one object, or one
    per line) and inline in the client messages table."""
    section = websocket_section()
    examples: list[dict[str, Any]] = []
    for block in _JSON_BLOCK.findall(section):
        try:
            examples.append(json.loads(block))
        except json.JSONDecodeError:
            examples.extend(json.loads(line) for line in block.splitlines() if line.strip())
    for cells in table_rows(subsection(4)):
        examples.extend(json.loads(raw) for raw in _INLINE_JSON.findall(cells[0]))
    return examples


def documented_client_messages() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for example in json_examples():
        kind = example["type"]
        if kind != "session.started":
            found.setdefault(kind, set()).update(set(example) - {"type"})
    start_table = {_NAME.findall(cells[0])[0] for cells in table_rows(subsection(1))}
    found.setdefault("session.start", set()).update(start_table)
    return found


def struct_fields(cls: type[ev.Event]) -> tuple[set[str], set[str]]:
    """(always sent, sent where they apply: UNSET by default)."""
    always, optional = set(), set()
    for field in msgspec.structs.fields(cls):
        (optional if field.default is ev.UNSET else always).add(field.name)
    return always, optional


def wire_fields(cls: type[ev.ClientMessage]) -> set[str]:
    if cls is ev.StartMessage:  # `conversation`: set by the Realtime API's handshake only
        return {f.name for f in dataclasses.fields(ev.StreamConfig)} - {"conversation"}
    if cls is ev.EndMessage:
        return set()  # its `kind` is the message's type
    return {f.name for f in dataclasses.fields(cls)}


EVENTS = {str(cls.__struct_config__.tag): cls for cls in get_args(ev.StreamEvent)}


def test_every_event_is_documented_and_every_documented_event_exists() -> None:
    assert set(documented_events()) == set(EVENTS)


@pytest.mark.parametrize("kind", sorted(EVENTS))
def test_event_fields_match_the_docs(kind: str) -> None:
    always, optional = documented_events()[kind]
    assert (always, optional) == struct_fields(EVENTS[kind])


def test_every_client_message_is_documented_and_every_documented_one_exists() -> None:
    assert set(documented_client_messages()) == set(ev.CLIENT_MESSAGE_TYPES)


@pytest.mark.parametrize("kind", sorted(ev.CLIENT_MESSAGE_TYPES))
def test_client_message_fields_match_the_docs(kind: str) -> None:
    assert documented_client_messages()[kind] == wire_fields(ev.CLIENT_MESSAGE_TYPES[kind])


def test_the_grpc_section_names_the_events_voxserve_v1_cannot_carry() -> None:
    text = PROTOCOL.read_text(encoding="utf-8")
    grpc_section = text[text.index("## gRPC `voxserve.v1`") :]
    sentence = grpc_section[grpc_section.index("The WebSocket's") :]
    sentence = _ASIDE.sub("", sentence[: sentence.index("have no")])
    not_sent = {
        ev.event_type(event)
        for event, _ in SAMPLES
        if grpc_events.encode_event(event, pb.ConverseResponse) is None
    }
    assert set(_NAME.findall(sentence)) == not_sent


def test_the_reader_finds_what_it_should() -> None:
    """Guards the parsing above: a table it stopped reading would pass the tests vacuously."""
    events = documented_events()
    assert events["tts.end"] == (
        {"reply", "chunks", "audio_ms", "interrupted", "underruns"},
        {"played_ms"},
    )
    assert events["vad.start"] == ({"segment", "start_ms"}, set())
    assert len(documented_client_messages()["session.start"]) == 14

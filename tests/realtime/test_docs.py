"""docs/realtime.md against the Realtime codec, both ways, so the two cannot drift: the client
events the decoder takes and refuses, the server events the encoder sends (GA and beta
names), what each voxserve event becomes (checked by encoding a sample of each), and the
session fields accepted but not used."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from tests.event_samples import SAMPLES
from tests.realtime.helpers import CONVERSATION_SAMPLES, codec
from tests.realtime.test_encoder import STARTED, run, spoken_reply
from voxserve import events as ev
from voxserve.server.realtime_api.codec import REFUSED
from voxserve.server.realtime_api.events import BETA, SERVER_EVENTS, TRACK_EVENTS
from voxserve.server.realtime_api.update import IGNORED

DOC = Path(__file__).resolve().parents[2] / "docs" / "realtime.md"
_NAME = re.compile(r"`([a-z_.]+)`")


def section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def tables(text: str) -> list[list[list[str]]]:
    """Each table's body rows as cells (header and rule left out)."""
    found: list[list[list[str]]] = []
    rows: list[list[str]] | None = None
    for line in text.splitlines():
        if line.startswith("|"):
            if rows is None:
                rows = []
                found.append(rows)
                continue  # the header
            if not line.startswith("|---"):
                rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        else:
            rows = None
    return found


def first_names(rows: list[list[str]]) -> list[str]:
    return [_NAME.findall(row[0])[0] for row in rows if _NAME.findall(row[0])]


def test_the_client_events_table_is_what_the_decoder_takes() -> None:
    decoder, _ = codec()
    taken, refused = tables(section("Client events"))
    assert sorted(first_names(taken)) == sorted(decoder.event_types)
    assert set(first_names(refused)) == set(REFUSED)


def test_the_server_events_table_is_what_the_encoder_sends() -> None:
    rows = tables(section("Server events"))[0]
    assert first_names(rows) == list(SERVER_EVENTS)
    for row in rows:
        ga = _NAME.findall(row[0])[0]
        expected = set() if ga == "conversation.item.done" else {BETA.get(ga, ga)}
        if ga == "session.updated":
            expected.add("transcription_session.updated")
        assert set(_NAME.findall(row[1])) == expected, ga


def test_what_each_voxserve_event_becomes() -> None:
    """Encoded after a response opened: what comes out is what the row names; a row that
    says none gets nothing."""
    rows = tables(section("Server events"))[1]
    documented = {_NAME.findall(row[0])[0]: row[1] for row in rows if _NAME.findall(row[0])}
    tags = {str(cls.__struct_config__.tag) for cls in get_args(ev.ServerEvent)}
    assert set(documented) == tags
    for sample in [sample for sample, _ in SAMPLES] + CONVERSATION_SAMPLES:
        _, encoder = codec()
        run(encoder, [STARTED, *spoken_reply()[:2]])
        emitted = {e["type"] for e in run(encoder, [sample])}
        cell = documented[ev.event_type(sample)]
        assert emitted <= set(_NAME.findall(cell)), ev.event_type(sample)
        if cell.startswith("none"):
            assert not emitted


def test_the_track_events_table_is_what_a_call_sends() -> None:
    assert first_names(tables(section("WebRTC calls"))[0]) == list(TRACK_EVENTS)


def test_fields_accepted_and_not_used() -> None:
    text = section("Settings")
    paragraph = text[text.index("Accepted and not used") : text.index("Any other field")]
    assert set(_NAME.findall(paragraph)) - {"null"} == IGNORED | {"noise_reduction"}


def test_the_reader_finds_what_it_should() -> None:
    """Guards the parsing: a table it stopped reading would pass the tests vacuously."""
    assert len(tables(section("Server events"))[0]) == len(SERVER_EVENTS) > 20
    assert len(tables(section("Errors"))[0]) >= 8

"""Hostile input, Realtime door (issue 35, finding 10 and the minor ones): /v1/realtime on a
real server with the real embedded engines, while a live /v1/stream is watched.

- Every hostile client event of each class (unknown types, ill-typed fields, bad JSON,
  nesting past `limits.max_json_depth`, messages past `limits.max_message_bytes`, bad base64
  audio, floods of appends, commit/cancel/truncate out of order, oversized instructions,
  tools and items) gets its `error` event with its code, tied to its `event_id` where the
  event was read that far, and the session goes on (it then answers a push-to-talk turn).
- Push-to-talk as documented (docs/realtime.md): `input_audio_buffer.commit` then
  `response.create`, sent together, answer that turn (finding 10: the response ran at once
  on the conversation without the turn, empty, before `committed`).
- A refused connection's error has an event id like every other (it was `event__1`), and a
  bad append's error comes at once, not when the next non-append event hands over what the
  fast path held back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.helpers import fixture_texts, realtime_connection, wer
from tests.hostile.watch import watched
from tests.realtime.test_realtime_sdk import (
    MODEL,
    audio_of,
    opened,
    rms,
    send_audio,
    speech,
    types,
    until,
    update,
)
from voxserve.config import load_settings
from voxserve.server.realtime_api.update import MAX_TEXT, MAX_TOOLS

pytestmark = pytest.mark.timeout(90)
Event = dict[str, Any]
PTT = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
EVENT_ID = re.compile(r"^event_[0-9a-f]{16}_\d+$")


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    """Real engines, no key (the watched live stream sends none); the rules responder says
    a fixed time."""
    live = start_server(load_settings(port=free_port(), log_level="warning"))
    responder = live.runtime.engines.responder
    assert hasattr(responder, "_now"), responder
    responder._now = lambda: datetime(2026, 11, 29, 15, 47)
    yield live
    stop_server(live)


def _url(live: LiveServer, query: str = "") -> str:
    return f"ws://127.0.0.1:{live.settings.port}/v1/realtime?model={MODEL}{query}"


def _ev(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, "event_id": "evt_h", **fields})


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


Case = tuple[str, Callable[[int], str], str, bool]  # name, text(limit), code, tied to evt_h


def _hostile_events() -> list[Case]:
    """Each class of hostile event, and the code it gets; True: the error names evt_h."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ""}]}
    too_long_item = {**item, "content": [{"type": "input_text", "text": "x" * 4_001}]}
    tools = [{"type": "function", "name": f"f{i}"} for i in range(MAX_TOOLS + 1)]
    cases: list[Case] = [
        ("type not a string", lambda _: json.dumps({"type": 7, "event_id": "evt_h"}),
         "invalid_message", True),
        ("no type", lambda _: json.dumps({"event_id": "evt_h"}), "invalid_message", True),
        ("not an object", lambda _: "[1, 2]", "invalid_json", False),
        ("cut JSON", lambda _: '{"type": "response.create", ', "invalid_json", False),
        ("nested past the depth", lambda _: '{"type": "x", "a": ' + "[" * 40 + "]" * 40 + "}",
         "invalid_json", False),
        ("nested 100k deep", lambda _: '{"type": "x", "a": ' + "[" * 100_000 + "]" * 100_000
         + "}", "invalid_json", False),
        ("past max_message_bytes", lambda limit: _ev("input_audio_buffer.append",
         audio="A" * limit), "message_too_large", False),
        ("lone surrogate", lambda _: '{"type": "response.create", "response": '
         '{"instructions": "\\ud800"}}', "invalid_message", False),
        ("event_id too long", lambda _: json.dumps({"type": "response.create",
         "event_id": "e" * 65}), "invalid_message", False),
        ("audio not a string", lambda _: _ev("input_audio_buffer.append", audio=5),
         "invalid_message", True),
        ("empty audio", lambda _: _ev("input_audio_buffer.append", audio=""), "empty_audio", True),
        ("odd-length PCM16", lambda _: _ev("input_audio_buffer.append", audio=_b64(b"abc")),
         "odd_length_pcm", True),
        ("cancel with no response", lambda _: _ev("response.cancel"),
         "response_cancel_not_active", True),
        ("truncate an unknown item", lambda _: _ev("conversation.item.truncate", item_id="nope",
         content_index=0, audio_end_ms=5), "invalid_parameter", True),
        ("delete an unknown item", lambda _: _ev("conversation.item.delete", item_id="nope"),
         "invalid_parameter", True),
        ("instructions past MAX_TEXT", lambda _: _ev("session.update", session={
         "type": "realtime", "instructions": "x" * (MAX_TEXT + 1)}), "invalid_parameter", True),
        ("response instructions past MAX_TEXT", lambda _: _ev("response.create", response={
         "instructions": "x" * (MAX_TEXT + 1)}), "invalid_parameter", True),
        ("tools past MAX_TOOLS", lambda _: _ev("session.update", session={
         "type": "realtime", "tools": tools}), "invalid_parameter", True),
        ("item text past max_text_chars", lambda _: _ev("conversation.item.create",
         item=too_long_item), "text_too_long", True),
        ("unknown session field", lambda _: _ev("session.update", session={
         "type": "realtime", "bogus": 1}), "invalid_parameter", True),
        ("huge integer", lambda _: _ev("session.update", session={
         "type": "realtime", "max_output_tokens": 10**30}), "invalid_parameter", True),
    ]  # fmt: skip
    rng = random.Random(35)
    for i in range(8):  # generated: unknown types, bad base64
        kind = "".join(rng.choice("abcxyz._ \u00e9\u4e2d") for _ in range(rng.randint(1, 40)))
        cases.append((f"unknown type {i}", lambda _, k=kind: _ev(k), "invalid_message", True))
        junk = "".join(rng.choice("AZaz09+/=!-_ \n") for _ in range(rng.randint(1, 64)))
        junk = junk if len(junk) % 4 else junk + "!"  # never valid base64 by chance
        cases.append((f"bad base64 {i}", lambda _, j=junk: _ev("input_audio_buffer.append",
                      audio=j), "invalid_audio", True))  # fmt: skip
    return cases


async def _error(ws: ClientConnection, limit_s: float = 5.0) -> Event:
    """The next `error` event (others are skipped)."""
    async with asyncio.timeout(limit_s):
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "error":
                return event  # type: ignore[no-any-return]


async def test_hostile_events_get_their_errors_and_the_session_goes_on(live: LiveServer) -> None:
    limit = live.settings.limits.max_message_bytes
    async with watched(live.http_url) as watch:
        async with connect(_url(live), max_size=None) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            for name, text, code, tied in _hostile_events():
                await ws.send(text(limit))
                error = (await _error(ws))["error"]
                assert error["code"] == code, (name, error)
                assert error["event_id"] == ("evt_h" if tied else None), (name, error)
                assert error["type"] == "invalid_request_error", (name, error)
            # A flood: 2,000 appends of one sample, then 300 bad ones (each answered).
            for _ in range(2_000):
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "AAA="}))
            for i in range(300):
                await ws.send(_ev("input_audio_buffer.append", audio=_b64(bytes(2 * i + 1))))
            for i in range(300):
                error = (await _error(ws))["error"]
                assert error["code"] == "odd_length_pcm", (i, error)
            # Still the same session: an update is applied.
            await ws.send(json.dumps({"type": "session.update", "session": PTT}))
            async with asyncio.timeout(5):
                while json.loads(await ws.recv())["type"] != "session.updated":
                    pass
    watch.assert_unhurt(max_growth_mb=150)


# --- push-to-talk ---------------------------------------------------------------------------


async def test_push_to_talk_commit_and_create_at_once_answer_that_turn(live: LiveServer) -> None:
    """The finding's flow with the official SDK: speech, then commit and response.create back
    to back: the response answers that turn (text and audio), after its committed."""
    said = fixture_texts()["command.wav"]
    async with watched(live.http_url) as watch:
        async with realtime_connection(live, "unused", model=MODEL) as conn:
            await opened(conn)
            seen: list[Event] = []
            await update(conn, seen, PTT)
            await send_audio(conn, speech("command.wav", pad_s=0.3), speed=50.0)
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            done = await until(conn, seen, "response.done", limit_s=60)
    kinds = types(seen)
    order = [
        kinds.index(k)
        for k in (
            "input_audio_buffer.committed",
            "conversation.item.input_audio_transcription.completed",
            "response.created",
            "response.output_audio.delta",
            "response.done",
        )
    ]
    assert order == sorted(order), kinds
    committed = next(e for e in seen if e["type"] == "input_audio_buffer.committed")
    heard = next(
        e for e in seen if e["type"] == "conversation.item.input_audio_transcription.completed"
    )
    assert heard["item_id"] == committed["item_id"]
    assert wer(said, heard["transcript"]) <= 0.2, heard
    answer = next(
        e
        for e in seen
        if e["type"] == "conversation.item.added" and e["item"]["role"] == "assistant"
    )
    assert answer["previous_item_id"] == committed["item_id"]  # it answers that turn
    assert done["response"]["status"] == "completed", done
    text = done["response"]["output"][0]["content"][0]["transcript"]
    assert "forty-seven" in text, text  # the rules responder's answer to "what time is it"
    pcm = np.frombuffer(audio_of(seen), dtype=np.int16)
    assert pcm.size > 24_000 // 2 and rms(pcm) > 300, (pcm.size, rms(pcm))
    watch.assert_unhurt(max_growth_mb=150)


@pytest.mark.parametrize("case", ["empty commit", "cancel while it waits", "second create"])
async def test_push_to_talk_out_of_order(live: LiveServer, case: str) -> None:
    """commit/response.create/cancel out of order: each answered, none left waiting."""
    async with realtime_connection(live, "unused", model=MODEL) as conn:
        await opened(conn)
        seen: list[Event] = []
        await update(conn, seen, PTT)
        if case != "empty commit":
            await send_audio(conn, speech("command.wav", pad_s=0.3), speed=50.0)
        await conn.input_audio_buffer.commit(event_id="evt_commit")
        await conn.response.create(event_id="evt_create")
        if case == "cancel while it waits":
            await conn.response.cancel(event_id="evt_cancel")
        elif case == "second create":
            await conn.response.create(event_id="evt_again")
        done = await until(conn, seen, "response.done", limit_s=60)
        # The session goes on: a text turn is answered.
        content = [{"type": "input_text", "text": "What time is it?"}]
        item = {"type": "message", "role": "user", "content": content}
        await conn.conversation.item.create(item=item)  # type: ignore[arg-type]
        await conn.response.create(response={"output_modalities": ["text"]})
        after = await until(conn, seen, "response.done", limit_s=60)
    errors = [e["error"]["code"] for e in seen if e["type"] == "error"]
    if case == "empty commit":
        assert errors == ["empty_audio"], errors
        assert done["response"]["status"] == "completed", done
    elif case == "cancel while it waits":
        assert errors == [], errors
        assert done["response"]["status"] == "cancelled", done
        assert done["response"]["status_details"]["reason"] == "client_cancelled", done
    else:
        assert errors == ["conversation_already_has_active_response"], errors
        assert done["response"]["status"] == "completed", done
        assert "input_audio_buffer.committed" in types(seen)
    assert after["response"]["status"] == "completed", after
    assert types(seen).count("response.created") == 2, types(seen)


# --- the minor ones -----------------------------------------------------------------------


async def test_a_refused_connection_has_a_proper_event_id(live: LiveServer) -> None:
    ids = set()
    for _ in range(3):
        async with connect(_url(live, "&intent=translation")) as ws:
            refused = json.loads(await ws.recv())
        assert refused["error"]["code"] == "invalid_parameter", refused
        assert EVENT_ID.match(refused["event_id"]), refused
        ids.add(refused["event_id"])
    assert len(ids) == 3, ids  # not one shared "event__1"


BAD_APPENDS: dict[str, tuple[str, str]] = {
    "odd length": (_b64(b"\x01\x02\x03"), "odd_length_pcm"),
    "empty": ("", "empty_audio"),
    "bad base64": ("AAA", "invalid_audio"),
    "padding inside": ("AA==AAAA", "invalid_audio"),
}


async def test_a_bad_append_is_answered_at_once(live: LiveServer) -> None:
    """After good appends (which the fast path holds back until a VAD batch is due), a bad
    one's error comes with nothing else sent."""
    good = json.dumps({"type": "input_audio_buffer.append", "audio": _b64(bytes(960))})
    async with connect(_url(live)) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await asyncio.sleep(0.2)  # the receiver waits: the fast path is open
        for name, (audio, code) in BAD_APPENDS.items():
            await ws.send(good)
            await asyncio.sleep(0.05)
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            error = (await _error(ws, limit_s=1.5))["error"]
            assert error["code"] == code, (name, error)

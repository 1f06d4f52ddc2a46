"""/v1/realtime end to end with the official `openai` SDK's realtime client
(`client.realtime.connect`), against a real server on the real embedded models (silero VAD,
whisper, piper, the rules responder), and the chat-completions stand-in (tests/chat_standin.py)
where a test needs tool calls.

The SDK builds the URL from `base_url` ("http://host:port/v1" -> "ws://host:port/v1/realtime
?model=..."), sends the key as `Authorization: Bearer`, and runs on the installed websockets
(17; its `realtime` extra asks for <16, which these tests show it does not need).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import httpx
import numpy as np
import pytest
from openai.resources.realtime.realtime import AsyncRealtimeConnection
from pydantic import SecretStr
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.chat_standin import ANSWER, ChatStandin, chat_fixtures
from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import silence
from tests.helpers import (
    fixture_audio,
    fixture_texts,
    realtime_connection,
    sessions_ended,
    wer,
)
from voxserve.audio.resample import resample
from voxserve.audio.wav import write_wav
from voxserve.config import load_settings

KEY = "realtime-test-key"
MODEL = "gpt-realtime"
RATE = 24_000
Event = dict[str, Any]


# --- servers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rt_server() -> Iterator[LiveServer]:
    """Real engines (rules responder) behind an API key."""
    settings = load_settings(port=free_port(), log_level="warning", api_keys=[SecretStr(KEY)])
    live = start_server(settings)
    yield live
    stop_server(live)


chat_standin, tool_server = chat_fixtures()  # the `openai` responder at a stand-in


@pytest.fixture
def fixed_clock(rt_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules responder says the time: a fixed one, spoken for over a second."""
    responder = rt_server.runtime.engines.responder
    assert hasattr(responder, "_now"), responder
    monkeypatch.setattr(responder, "_now", lambda: datetime(2026, 11, 29, 15, 47))


# --- the client side ----------------------------------------------------------------------


def speech(name: str, rate: int = RATE, pad_s: float = 0.8) -> bytes:
    """A fixture's speech and `pad_s` of silence, as PCM16 at `rate`."""
    audio = np.concatenate([fixture_audio(name), silence(pad_s)])
    return resample(audio, 16_000, rate).tobytes()


async def send_audio(
    conn: AsyncRealtimeConnection, data: bytes, *, bytes_per_s: int = 2 * RATE, speed: float = 2.0
) -> None:
    """Appends of 100 ms, at `speed` times real time."""
    step = bytes_per_s // 10
    for i in range(0, len(data), step):
        await conn.input_audio_buffer.append(audio=base64.b64encode(data[i : i + step]).decode())
        await asyncio.sleep(0.1 / speed)


async def recv(conn: AsyncRealtimeConnection) -> Event:
    raw = await conn.recv_bytes()
    event: Event = json.loads(raw)
    return event


async def until(
    conn: AsyncRealtimeConnection,
    seen: list[Event],
    kind: str,
    *,
    where: Callable[[Event], bool] = lambda e: True,
    limit_s: float = 30.0,
) -> Event:
    """Read events into `seen` until one of `kind` (and `where`) arrives."""
    async with asyncio.timeout(limit_s):
        while True:
            event = await recv(conn)
            seen.append(event)
            if event["type"] == kind and where(event):
                return event


def types(seen: list[Event]) -> list[str]:
    return [e["type"] for e in seen]


def of(seen: list[Event], kind: str) -> list[Event]:
    return [e for e in seen if e["type"] == kind]


def audio_of(seen: list[Event]) -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in of(seen, "response.output_audio.delta"))


def rms(pcm: np.ndarray) -> float:
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if pcm.size else 0.0


async def opened(conn: AsyncRealtimeConnection) -> Event:
    first = await recv(conn)
    assert first["type"] == "session.created", first
    return first


async def update(
    conn: AsyncRealtimeConnection, seen: list[Event], session: dict[str, Any]
) -> Event:
    await conn.session.update(session=session)  # type: ignore[arg-type]
    return await until(conn, seen, "session.updated", limit_s=10)


# --- (a) a spoken question answered with audio ------------------------------------------


async def test_spoken_question_answered_with_audio(
    rt_server: LiveServer, fixed_clock: None
) -> None:
    texts = fixture_texts()
    gauge = rt_server.runtime.metrics.registry.get_sample_value
    labels = {"mode": "assistant", "transport": "realtime"}
    async with realtime_connection(rt_server, KEY, model=MODEL) as conn:
        created = await conn.recv()  # the SDK's typed event
        assert created.type == "session.created"
        assert created.session.model == MODEL  # type: ignore[union-attr]
        assert gauge("voxserve_sessions_active", labels) == 1
        seen: list[Event] = []
        sender = asyncio.create_task(send_audio(conn, speech("command.wav")))
        done = await until(conn, seen, "response.done", limit_s=60)
        await sender
    kinds = types(seen)
    for kind in (
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        "response.output_audio.delta",
        "response.output_audio_transcript.done",
    ):
        assert kind in kinds, (kind, kinds)
    order = [
        kinds.index(k)
        for k in (
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "response.created",
            "response.output_audio.delta",
        )
    ]
    assert order == sorted(order), kinds
    started = of(seen, "input_audio_buffer.speech_started")[0]
    committed = of(seen, "input_audio_buffer.committed")[0]
    transcript = of(seen, "conversation.item.input_audio_transcription.completed")[0]
    assert started["item_id"] == committed["item_id"] == transcript["item_id"]
    assert wer(texts["command.wav"], transcript["transcript"]) <= 0.2, transcript
    limits = of(seen, "rate_limits.updated")[0]["rate_limits"]  # the key's quotas
    assert [x["name"] for x in limits] == ["requests", "tokens"], limits
    assert limits[0]["limit"] == 40, limits
    # the spoken turn's audio, 1 token per 100 ms (docs/realtime.md "Usage")
    heard = done["response"]["usage"]["input_token_details"]["audio_tokens"]
    assert 5 <= heard <= 20, done["response"]["usage"]  # its speech: under 2 s
    response = of(seen, "response.created")[0]["response"]
    assert done["response"]["id"] == response["id"]
    assert done["response"]["status"] == "completed", done
    said = of(seen, "response.output_audio_transcript.done")[0]["transcript"]
    assert "forty" in said.lower() or "47" in said, said
    pcm = np.frombuffer(audio_of(seen), dtype=np.int16)
    assert pcm.size > RATE // 2 and rms(pcm) > 300, (pcm.size, rms(pcm))  # speech, not silence
    await sessions_ended(rt_server.runtime)
    assert gauge("voxserve_sessions_active", labels) == 0


# --- (b) a transcription-only session ----------------------------------------------------


async def test_transcription_session_transcribes_and_never_responds(rt_server: LiveServer) -> None:
    texts = fixture_texts()
    async with realtime_connection(
        rt_server, KEY, model=MODEL, extra_query={"intent": "transcription"}
    ) as conn:
        created = await opened(conn)
        assert created["session"]["type"] == "transcription", created
        seen: list[Event] = []
        await send_audio(conn, speech("lights.wav"), speed=4.0)
        done = await until(conn, seen, "conversation.item.input_audio_transcription.completed")
        with pytest.raises(TimeoutError):  # a response would have begun by now
            await until(conn, seen, "response.created", limit_s=2.0)
    assert wer(texts["lights.wav"], done["transcript"]) <= 0.2, done
    assert not [k for k in types(seen) if k.startswith("response.")], types(seen)


# --- (c) barge-in -------------------------------------------------------------------------


async def test_speech_during_the_reply_cancels_it(rt_server: LiveServer) -> None:
    async with realtime_connection(rt_server, KEY, model=MODEL) as conn:
        await opened(conn)
        seen: list[Event] = []
        # The fallback reply repeats the question: several seconds of speech.
        await send_audio(conn, speech("reminder.wav"), speed=4.0)
        await until(conn, seen, "response.output_audio.delta", limit_s=60)
        first = of(seen, "response.created")[0]["response"]["id"]
        await send_audio(conn, speech("command.wav"), speed=1.0)  # talks over it
        done = await until(
            conn, seen, "response.done", where=lambda e: e["response"]["id"] == first
        )
    assert done["response"]["status"] == "cancelled", done
    kinds = types(seen)
    assert kinds.index("input_audio_buffer.speech_started", kinds.index("response.created")) < len(
        kinds
    )


# --- (d) push-to-talk ---------------------------------------------------------------------


async def test_push_to_talk_commit_then_response_create(
    rt_server: LiveServer, fixed_clock: None
) -> None:
    texts = fixture_texts()
    async with realtime_connection(rt_server, KEY, model=MODEL) as conn:
        await opened(conn)
        seen: list[Event] = []
        updated = await update(
            conn, seen, {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        )
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        await send_audio(conn, speech("command.wav", pad_s=0.3), speed=8.0)
        await conn.input_audio_buffer.commit()
        committed = await until(conn, seen, "input_audio_buffer.committed")
        final = await until(conn, seen, "conversation.item.input_audio_transcription.completed")
        assert final["item_id"] == committed["item_id"]
        assert "response.created" not in types(seen)  # nothing until asked
        await conn.response.create()
        done = await until(conn, seen, "response.done", limit_s=60)
        # The client heard half a second of the answer, then forgets the question.
        answer = done["response"]["output"][0]["id"]
        await conn.conversation.item.truncate(item_id=answer, content_index=0, audio_end_ms=500)
        truncated = await until(conn, seen, "conversation.item.truncated")
        await conn.conversation.item.delete(item_id=final["item_id"])
        deleted = await until(conn, seen, "conversation.item.deleted")
    assert (truncated["item_id"], truncated["audio_end_ms"]) == (answer, 500)
    assert deleted["item_id"] == final["item_id"]
    assert wer(texts["command.wav"], final["transcript"]) <= 0.2, final
    assert "input_audio_buffer.speech_started" not in types(seen)
    assert done["response"]["status"] == "completed", done
    assert rms(np.frombuffer(audio_of(seen), dtype=np.int16)) > 300


# --- beta names -----------------------------------------------------------------------------


async def test_the_beta_header_selects_beta_names(rt_server: LiveServer, fixed_clock: None) -> None:
    beta = {"OpenAI-Beta": "realtime=v1"}
    async with realtime_connection(rt_server, KEY, model=MODEL, extra_headers=beta) as conn:
        created = await opened(conn)
        assert created["session"]["input_audio_format"] == "pcm16", created  # beta's shape
        seen: list[Event] = []
        user_text = {"type": "input_text", "text": "What time is it?"}
        item = {"type": "message", "role": "user", "content": [user_text]}
        await conn.send_raw(json.dumps({"type": "conversation.item.create", "item": item}))
        await conn.send_raw(json.dumps({"type": "response.create"}))
        done = await until(conn, seen, "response.done", limit_s=60)
    assert done["response"]["status"] == "completed", done
    kinds = set(types(seen))
    assert {"conversation.item.created", "response.audio.delta"} <= kinds, kinds
    assert "forty-seven" in of(seen, "response.audio_transcript.done")[0]["transcript"]
    assert not kinds & {"conversation.item.added", "response.output_audio.delta"}, kinds


# --- (e) a tool call round trip -----------------------------------------------------------


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


async def test_tool_call_round_trip(tool_server: LiveServer, chat_standin: ChatStandin) -> None:
    async with realtime_connection(tool_server, KEY, model=MODEL) as conn:
        await opened(conn)
        seen: list[Event] = []
        await update(
            conn, seen, {"type": "realtime", "tools": [WEATHER_TOOL], "tool_choice": "auto"}
        )
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What is the weather in Paris?"}],
            }
        )
        await conn.response.create()
        call = await until(conn, seen, "response.function_call_arguments.done")
        first = await until(conn, seen, "response.done")
        assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Paris"})
        assert first["response"]["status"] == "completed"
        assert [o["type"] for o in first["response"]["output"]] == ["function_call"]
        await conn.conversation.item.create(
            item={
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": '{"sky": "sunny"}',
            }
        )
        await conn.response.create()
        done = await until(conn, seen, "response.done", limit_s=60)
    assert done["response"]["status"] == "completed", done
    said = of(seen, "response.output_audio_transcript.done") or of(
        seen, "response.output_text.done"
    )
    assert said and ANSWER in str(said[-1].get("transcript") or said[-1]["text"]), said
    assert len(chat_standin.requests) == 2
    tools = chat_standin.requests[0]["tools"]
    assert tools[0]["function"]["name"] == "get_weather", tools
    messages = chat_standin.requests[1]["messages"]
    tool_message = [m for m in messages if m.get("role") == "tool"]
    assert tool_message and tool_message[0]["content"] == '{"sky": "sunny"}', messages
    # the client saw the session's call id; the model reads its own back
    assert tool_message[0]["tool_call_id"] == chat_standin.call_ids[0] != call["call_id"]
    asked = [m for m in messages if m.get("tool_calls")]
    assert asked and asked[0]["tool_calls"][0]["function"]["name"] == "get_weather", messages


# --- (f) G.711 mu-law in and out ----------------------------------------------------------


def ulaw_encode(pcm: np.ndarray) -> bytes:
    """ITU-T G.711 mu-law, written here so the test does not trust the server's codec."""
    x = pcm.astype(np.int32)
    sign = np.where(x < 0, 0x80, 0)
    x = np.minimum(np.abs(x), 32635) + 0x84
    exponent = np.floor(np.log2(x)).astype(np.int32) - 7
    mantissa = (x >> (exponent + 3)) & 0x0F
    coded: bytes = (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8).tobytes()
    return coded


def ulaw_decode(data: bytes) -> np.ndarray:
    u = ~np.frombuffer(data, dtype=np.uint8).astype(np.int32) & 0xFF
    exponent, mantissa = (u >> 4) & 0x07, u & 0x0F
    magnitude = ((mantissa << 3) + 0x84 << exponent) - 0x84
    return np.where(u & 0x80, -magnitude, magnitude).astype(np.int16)


async def test_g711_mu_law_in_and_out(rt_server: LiveServer, fixed_clock: None) -> None:
    texts = fixture_texts()
    question = ulaw_encode(np.frombuffer(speech("command.wav", rate=8000), dtype=np.int16))
    assert rms(ulaw_decode(question)) > 300  # the test's own codec round-trips
    async with realtime_connection(rt_server, KEY, model=MODEL) as conn:
        await opened(conn)
        seen: list[Event] = []
        pcmu = {"type": "audio/pcmu"}
        updated = await update(
            conn,
            seen,
            {"type": "realtime", "audio": {"input": {"format": pcmu}, "output": {"format": pcmu}}},
        )
        assert updated["session"]["audio"]["output"]["format"]["type"] == "audio/pcmu"
        await send_audio(conn, question, bytes_per_s=8000, speed=2.0)
        done = await until(conn, seen, "response.done", limit_s=60)
    final = of(seen, "conversation.item.input_audio_transcription.completed")[0]
    assert wer(texts["command.wav"], final["transcript"]) <= 0.2, final
    assert done["response"]["status"] == "completed"
    reply = ulaw_decode(audio_of(seen))
    assert reply.size > 8000 // 2 and rms(reply) > 300
    # What the server sent, heard as 8 kHz mu-law, says what its transcript says.
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {KEY}"}) as http:
        heard = await http.post(
            f"{rt_server.http_url}/v1/audio/transcriptions",
            files={"file": ("reply.wav", write_wav(reply, 8000), "audio/wav")},
            data={"model": "whisper-1"},
            timeout=30,
        )
    said = of(seen, "response.output_audio_transcript.done")[0]["transcript"]
    assert "forty-seven in the afternoon" in said, said
    text = heard.json()["text"].lower()  # whisper writes the time in digits
    assert "afternoon" in text and ("47" in text or "forty" in text), (said, text)


# --- (g) bad events -----------------------------------------------------------------------


async def test_bad_events_get_errors_and_the_session_goes_on(rt_server: LiveServer) -> None:
    limit = rt_server.settings.limits.max_message_bytes
    async with realtime_connection(rt_server, KEY, model=MODEL) as conn:
        await opened(conn)
        seen: list[Event] = []
        await conn.send_raw(json.dumps({"type": "no.such.event", "event_id": "evt_unknown"}))
        await conn.input_audio_buffer.append(audio="not base64 !!", event_id="evt_b64")
        await conn.input_audio_buffer.append(
            audio=base64.b64encode(b"\x01\x02\x03").decode(), event_id="evt_odd"
        )
        big = base64.b64encode(bytes(limit)).decode()
        await conn.input_audio_buffer.append(audio=big, event_id="evt_big")
        await conn.send_raw(b"\x00\x01")  # binary: not Realtime's
        await conn.response.cancel(event_id="evt_cancel")  # refused by the session, not the codec
        language = {"transcription": {"model": "whisper-1", "language": "xx"}}
        refused = {"type": "realtime", "audio": {"input": language}}
        await conn.session.update(session=refused, event_id="evt_update")  # type: ignore[arg-type]
        errors = [await until(conn, seen, "error", limit_s=10) for _ in range(7)]
        # The session still works: an update is applied (from the settings in force, not
        # the refused ones), then a push-to-talk turn.
        ptt = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        updated = await update(conn, seen, ptt)
        assert updated["session"]["audio"]["input"]["transcription"].get("language") is None
        await send_audio(conn, speech("command.wav", pad_s=0.3), speed=8.0)
        await conn.input_audio_buffer.commit(event_id="evt_commit")
        committed = await until(conn, seen, "input_audio_buffer.committed")
    # In order; the oversized one was not parsed, so its event_id is not known.
    assert [(e["error"]["event_id"], e["error"]["code"]) for e in errors] == [
        ("evt_unknown", "invalid_message"),
        ("evt_b64", "invalid_audio"),
        ("evt_odd", "odd_length_pcm"),
        (None, "message_too_large"),
        (None, "invalid_message"),  # the binary message
        ("evt_cancel", "response_cancel_not_active"),
        ("evt_update", "unknown_language"),  # refused by the session: nothing changed
    ], errors
    assert not [e for e in errors if e["error"]["type"] != "invalid_request_error"], errors
    assert committed["item_id"]


async def test_a_message_past_what_is_read_closes_1009(rt_server: LiveServer) -> None:
    url = f"ws://127.0.0.1:{rt_server.settings.port}/v1/realtime?model={MODEL}"
    headers = {"Authorization": f"Bearer {KEY}"}
    huge = "x" * (4 * rt_server.settings.limits.max_message_bytes + 1)  # realtime_stream.py
    async with connect(url, additional_headers=headers, max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(huge)
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


# --- (h) auth -----------------------------------------------------------------------------


async def test_auth_refused_without_the_key(rt_server: LiveServer) -> None:
    async with realtime_connection(rt_server, "not-the-key", model=MODEL) as conn:
        error = await recv(conn)
        with pytest.raises(ConnectionClosed) as closed:
            await recv(conn)
    assert (error["type"], error["error"]["code"]) == ("error", "unauthorized"), error
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    url = f"ws://127.0.0.1:{rt_server.settings.port}/v1/realtime?model={MODEL}"
    async with connect(url) as ws:  # no key at all
        error = json.loads(await ws.recv())
        assert error["error"]["code"] == "unauthorized"


async def test_other_sites_and_unknown_intents_are_refused(rt_server: LiveServer) -> None:
    url = f"ws://127.0.0.1:{rt_server.settings.port}/v1/realtime?model={MODEL}"
    key = {"Authorization": f"Bearer {KEY}"}
    for query, headers, code in [
        ("", {**key, "Origin": "https://elsewhere.example"}, "origin_not_allowed"),
        ("&intent=translation", key, "invalid_parameter"),
        ("x" * 129, key, "invalid_parameter"),  # a model name past 128 characters
    ]:
        async with connect(url + query, additional_headers=headers) as ws:
            error = json.loads(await ws.recv())
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
        assert error["error"]["code"] == code, error
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_auth_accepted_with_the_browser_subprotocol(rt_server: LiveServer) -> None:
    url = f"ws://127.0.0.1:{rt_server.settings.port}/v1/realtime?model={MODEL}"
    offered = ["realtime", f"openai-insecure-api-key.{KEY}"]
    async with connect(url, subprotocols=offered) as ws:  # type: ignore[arg-type]
        assert ws.subprotocol == "realtime"  # never the one that carries the key
        created = json.loads(await ws.recv())
    assert created["type"] == "session.created", created
    assert created["session"]["model"] == MODEL
    assert "input_audio_format" not in created["session"]  # GA names
    async with connect(url, subprotocols=[*offered, "openai-beta.realtime-v1"]) as ws:  # type: ignore[list-item]
        created = json.loads(await ws.recv())
    assert created["session"]["input_audio_format"] == "pcm16", created  # beta's, as asked


# --- (i) overload at connect --------------------------------------------------------------


async def test_overload_refused_at_connect(
    rt_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    await sessions_ended(rt_server.runtime)
    settings = rt_server.runtime.settings
    full = settings.model_copy(
        update={"limits": settings.limits.model_copy(update={"max_sessions": 0})}
    )
    monkeypatch.setattr(rt_server.runtime, "settings", full)
    t0 = time.monotonic()
    async with realtime_connection(rt_server, KEY, model=MODEL) as conn:
        error = await recv(conn)
        with pytest.raises(ConnectionClosed) as closed:
            await recv(conn)
    assert time.monotonic() - t0 < 5
    assert error["type"] == "error" and error["error"]["code"] == "overloaded", error
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013

"""What agent frameworks read from a Realtime response, end to end with the official
`openai` SDK's realtime client against a real server (real VAD, ASR and TTS) whose
`openai` responder talks to the chat-completions stand-in (tests/chat_standin.py):

- `response.metadata` echoed on response.created and response.done (LiveKit's
  generate_reply matches its `client_event_id` there), refused when out of OpenAI's bounds;
- the voice as the client named it (`alloy`), not the installed one;
- `usage` in OpenAI's shape: the stand-in's token counts, the reply's audio at 1 token per
  50 ms;
- a model that reuses one call id for every call: each call still has its own id, each
  output reaches the model after its own call, and the conversation goes on;
- a model that calls tools forever: `realtime.max_tool_calls_per_turn`, then a failed
  response with `too_many_tool_calls`.
"""

from __future__ import annotations

import math
from typing import Any

from openai.resources.realtime.realtime import AsyncRealtimeConnection

from tests import chat_standin as standin
from tests.conftest import LiveServer
from tests.helpers import realtime_connection
from tests.realtime.helpers import GA
from tests.realtime.test_realtime_sdk import (
    MODEL,
    RATE,
    WEATHER_TOOL,
    Event,
    audio_of,
    of,
    opened,
    until,
    update,
)

MAX_CALLS = 3


# a model that reuses one call id, as some local servers do
chat_standin, tool_server = standin.chat_fixtures(
    reuse_ids=True, realtime={"max_tool_calls_per_turn": MAX_CALLS}
)


async def say(conn: AsyncRealtimeConnection, text: str) -> None:
    content = [{"type": "input_text", "text": text}]
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": content}
    )


async def answer(conn: AsyncRealtimeConnection, call_id: str, output: str) -> None:
    item = {"type": "function_call_output", "call_id": call_id, "output": output}
    await conn.conversation.item.create(item=item)  # type: ignore[arg-type]
    await conn.response.create()


async def test_metadata_and_the_voice_name_are_echoed_and_usage_counted(
    tool_server: LiveServer,
) -> None:
    metadata = {"client_event_id": "evt_gen_1", "topic": "g" * 512}
    async with realtime_connection(tool_server, "x", model=MODEL) as conn:
        await opened(conn)
        seen: list[Event] = []
        await update(conn, seen, {"type": "realtime", "audio": {"output": {"voice": "alloy"}}})
        await say(conn, "hi")
        await conn.response.create(response={"metadata": metadata})
        created = await until(conn, seen, "response.created")
        done = await until(conn, seen, "response.done", limit_s=60)
        refused: dict[str, Any] = {}
        for event_id, bad in [
            ("evt_many", {f"k{i}": "v" for i in range(17)}),
            ("evt_long_key", {"k" * 65: "v"}),
            ("evt_long_value", {"k": "v" * 513}),
            ("evt_number", {"k": 1}),
        ]:
            await conn.send(
                {"type": "response.create", "event_id": event_id, "response": {"metadata": bad}}
            )  # type: ignore[arg-type]
            error = await until(conn, seen, "error")
            refused[event_id] = error["error"]["code"]
            assert error["error"]["event_id"] == event_id
    assert refused == {
        "evt_many": "invalid_parameter",
        "evt_long_key": "invalid_parameter",
        "evt_long_value": "invalid_parameter",
        "evt_number": "invalid_message",
    }
    for event in (created, done):
        GA.validate_python(event)  # the SDK's own model of the event
        response = event["response"]
        assert response["metadata"] == metadata
        assert response["audio"]["output"]["voice"] == "alloy"  # not the installed `joe`
    assert done["response"]["status"] == "completed", done
    said = of(seen, "response.output_audio_transcript.done")
    assert said and said[0]["transcript"] == standin.GREETING
    usage = done["response"]["usage"]
    audio_ms = len(audio_of(seen)) // 2 * 1000 // RATE
    assert audio_ms > 500
    assert usage["output_token_details"]["text_tokens"] == standin.COMPLETION_TOKENS
    assert abs(usage["output_token_details"]["audio_tokens"] - math.ceil(audio_ms / 50)) <= 1
    assert usage["input_token_details"] == {
        "text_tokens": standin.PROMPT_TOKENS,
        "audio_tokens": 0,  # a text message: no audio in the conversation
        "cached_tokens": standin.CACHED_TOKENS,
        "cached_tokens_details": {"text_tokens": standin.CACHED_TOKENS, "audio_tokens": 0},
    }
    assert usage["input_tokens"] == standin.PROMPT_TOKENS
    output = usage["output_token_details"]
    assert usage["output_tokens"] == output["text_tokens"] + output["audio_tokens"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


async def test_a_model_that_reuses_a_call_id_gets_each_output_after_its_own_call(
    tool_server: LiveServer, chat_standin: standin.ChatStandin
) -> None:
    chat_standin.requests.clear()
    async with realtime_connection(tool_server, "x", model=MODEL) as conn:
        await opened(conn)
        seen: list[Event] = []
        session = {"type": "realtime", "output_modalities": ["text"], "tools": [WEATHER_TOOL]}
        await update(conn, seen, session)
        calls = []
        for city, sky in (("Paris", "sunny"), ("Oslo", "rain")):
            await say(conn, f"what is the weather in {city}?")
            await conn.response.create()
            calls.append(await until(conn, seen, "response.function_call_arguments.done"))
            first = await until(conn, seen, "response.done")
            assert [o["type"] for o in first["response"]["output"]] == ["function_call"]
            await answer(conn, calls[-1]["call_id"], f'{{"sky": "{sky}"}}')
            done = await until(conn, seen, "response.done", limit_s=30)
            assert done["response"]["status"] == "completed", done
    ids = [call["call_id"] for call in calls]
    assert len(set(ids)) == 2 and standin.REUSED_ID not in ids  # the session's own ids
    texts = [e["text"] for e in of(seen, "response.output_text.done")]
    assert texts == [standin.ANSWER, standin.ANSWER]
    assert len(chat_standin.requests) == 4  # no call repeated, no loop
    last = chat_standin.requests[-1]["messages"]
    pairs = [
        (m["tool_calls"][0]["id"], last[i + 1]["tool_call_id"], last[i + 1]["content"])
        for i, m in enumerate(last)
        if m.get("tool_calls")
    ]
    # each call right before its own output, under the id the model gave it
    assert pairs == [
        (standin.REUSED_ID, standin.REUSED_ID, '{"sky": "sunny"}'),
        (standin.REUSED_ID, standin.REUSED_ID, '{"sky": "rain"}'),
    ]


async def test_a_model_that_keeps_calling_tools_is_stopped_at_the_turns_bound(
    tool_server: LiveServer,
) -> None:
    async with realtime_connection(tool_server, "x", model=MODEL) as conn:
        await opened(conn)
        seen: list[Event] = []
        session = {"type": "realtime", "output_modalities": ["text"], "tools": [WEATHER_TOOL]}
        await update(conn, seen, session)
        await say(conn, "the weather, again and again")
        await conn.response.create()
        statuses = []
        for _ in range(MAX_CALLS + 2):  # what pipecat does: answer each call, ask again
            done = await until(conn, seen, "response.done", limit_s=30)
            statuses.append(done["response"]["status"])
            calls = [o for o in done["response"]["output"] if o["type"] == "function_call"]
            if done["response"]["status"] != "completed" or not calls:
                break
            await answer(conn, calls[0]["call_id"], '{"sky": "grey"}')
    assert statuses == ["completed"] * MAX_CALLS + ["failed"]
    details = done["response"]["status_details"]
    assert details["error"]["code"] == "too_many_tool_calls", details
    (error,) = of(seen, "error")
    assert error["error"]["code"] == "too_many_tool_calls"
    assert "realtime.max_tool_calls_per_turn" in error["error"]["message"]

"""OpenAI's Agents SDK (`openai-agents`, pyproject.toml: clients): a `RealtimeRunner` session
on /v1/realtime, a spoken question, a function tool the SDK runs, and the spoken answer
after it. The LLM behind voxserve's `openai` responder is the chat-completions stand-in."""

from __future__ import annotations

import asyncio
import json

from agents import function_tool
from agents.realtime import AssistantMessageItem, RealtimeAgent, RealtimeItem, RealtimeRunner

from tests.chat_standin import ANSWER, WEATHER_ARGUMENTS, ChatStandin, chat_fixtures
from tests.clients.audio import chunks, question_pcm, rms
from tests.conftest import LiveServer

chat_standin, tool_server = chat_fixtures()

SKY = '{"sky": "sunny"}'


async def test_a_spoken_turn_calls_the_function_tool_then_answers_aloud(
    tool_server: LiveServer, chat_standin: ChatStandin
) -> None:
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return SKY

    agent = RealtimeAgent(name="weather", instructions="Answer briefly.", tools=[get_weather])
    runner = RealtimeRunner(agent)
    url = f"ws://127.0.0.1:{tool_server.settings.port}/v1/realtime?model=gpt-realtime"
    before = len(chat_standin.requests)
    audio = bytearray()
    seen: list[str] = []
    history: list[RealtimeItem] = []
    session = await runner.run(model_config={"url": url, "api_key": "x"})
    async with session:
        for chunk in chunks(question_pcm(), 24_000):
            await session.send_audio(chunk)
            await asyncio.sleep(0.025)  # four times real time
        async with asyncio.timeout(60):
            async for event in session:
                seen.append(event.type)
                if event.type == "error":
                    raise AssertionError(event.error)
                if event.type == "history_updated":
                    history = event.history
                if event.type == "audio" and "tool_end" in seen:
                    audio += event.audio.data
                if audio and "audio_end" in seen and said(history):
                    break  # the answer heard, and its transcript in the app's history
    assert asked == [WEATHER_ARGUMENTS["city"]], seen
    assert seen.index("tool_start") < seen.index("tool_end"), seen
    assert len(audio) > 24_000 and rms(bytes(audio)) > 300, (len(audio), rms(bytes(audio)))
    first, second = chat_standin.requests[before : before + 2]
    assert [t["function"]["name"] for t in first["tools"]] == ["get_weather"], first
    outputs = [m for m in second["messages"] if m.get("role") == "tool"]
    assert [json.loads(m["content"]) for m in outputs] == [json.loads(SKY)], second
    assert ANSWER in said(history), history


def said(history: list[RealtimeItem]) -> str:
    answers = [item for item in history if isinstance(item, AssistantMessageItem)]
    return " ".join(getattr(c, "transcript", None) or "" for a in answers for c in a.content)

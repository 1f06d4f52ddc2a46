"""LiveKit Agents (`livekit-agents`, `livekit-plugins-openai`, pyproject.toml: clients) against a
real server: the OpenAI plugin's `STT` (an upload) and `TTS`, its `RealtimeModel` session
(a spoken turn after `update_tools`, and `generate_reply()`), and an `AgentSession` run with
`run(user_input=...)` and a tool, the way LiveKit's own testing helpers run one: without a room.

Not covered: anything that needs a LiveKit server (a room, its WebRTC media and participants,
the worker's job dispatch); the session's audio input and output are the room's, so the
AgentSession here is text in, text out. The LLM behind voxserve's `openai` responder is the
chat-completions stand-in."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentSession, function_tool, llm, utils
from livekit.plugins import openai as lk_openai

from tests.chat_standin import ANSWER, GREETING, WEATHER_ARGUMENTS, ChatStandin, chat_fixtures
from tests.clients.audio import chunks, question_pcm, question_text, rms
from tests.conftest import LiveServer
from tests.helpers import wer

chat_standin, tool_server = chat_fixtures()

RATE = 24_000


@function_tool
async def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city.
    """
    return json.dumps({"sky": "sunny", "city": city})


@pytest.fixture
async def http() -> AsyncIterator[None]:
    """The plugins' HTTP session, as LiveKit's docs say to open one outside a worker."""
    async with utils.http_context.open():
        yield


def frame(pcm: bytes, rate: int) -> rtc.AudioFrame:
    return rtc.AudioFrame(pcm, sample_rate=rate, num_channels=1, samples_per_channel=len(pcm) // 2)


async def test_stt_recognizes_an_upload(tool_server: LiveServer, http: None) -> None:
    stt = lk_openai.STT(model="whisper-1", base_url=f"{tool_server.http_url}/v1", api_key="x")
    event = await stt.recognize(frame(question_pcm(16_000), 16_000))
    heard = event.alternatives[0].text
    assert wer(question_text(), heard) <= 0.2, heard


async def test_tts_synthesizes(tool_server: LiveServer, http: None) -> None:
    tts = lk_openai.TTS(
        model="tts-1", voice="alloy", base_url=f"{tool_server.http_url}/v1", api_key="x"
    )
    audio = bytearray()
    async with tts.synthesize("It is sunny in Paris today.") as stream:
        async for chunk in stream:
            assert chunk.frame.sample_rate == RATE
            audio += bytes(chunk.frame.data)
    assert len(audio) > RATE and rms(bytes(audio)) > 300, (len(audio), rms(bytes(audio)))


def realtime(live: LiveServer, **options: Any) -> lk_openai.realtime.RealtimeModel:
    return lk_openai.realtime.RealtimeModel(base_url=f"{live.http_url}/v1", api_key="x", **options)


async def drained(generation: llm.GenerationCreatedEvent) -> tuple[list[llm.FunctionCall], str]:
    """The generation's function calls and the text of its messages."""
    text: list[str] = []

    async def message(m: llm.MessageGeneration) -> None:
        text.extend([piece async for piece in m.text_stream])
        [_ async for _ in m.audio_stream]

    async def messages() -> None:
        await asyncio.gather(*[message(m) async for m in generation.message_stream])

    calls, _ = await asyncio.gather(_calls(generation), messages())
    return calls, "".join(text)


async def _calls(generation: llm.GenerationCreatedEvent) -> list[llm.FunctionCall]:
    return [call async for call in generation.function_stream]


async def test_realtime_session_spoken_turn_uses_the_updated_tools(
    tool_server: LiveServer, chat_standin: ChatStandin, http: None
) -> None:
    session = realtime(tool_server).session()
    generations: asyncio.Queue[llm.GenerationCreatedEvent] = asyncio.Queue()
    session.on("generation_created", generations.put_nowait)
    before = len(chat_standin.requests)
    try:
        await session.update_tools([get_weather])
        for chunk in chunks(question_pcm(RATE), RATE):
            session.push_audio(frame(chunk, RATE))
            await asyncio.sleep(0.025)
        async with asyncio.timeout(60):
            calls, _ = await drained(await generations.get())
    finally:
        await session.aclose()
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", WEATHER_ARGUMENTS)
    ], calls
    offered = chat_standin.requests[before]["tools"]
    assert [t["function"]["name"] for t in offered] == ["get_weather"], offered
    users = [m for m in chat_standin.requests[before]["messages"] if m["role"] == "user"]
    assert wer(question_text(), str(users[-1]["content"])) <= 0.2, users


async def test_realtime_session_generate_reply(tool_server: LiveServer, http: None) -> None:
    session = realtime(tool_server, modalities=["text"]).session()
    try:
        async with asyncio.timeout(30):
            generation = await session.generate_reply(instructions="Say something.")
            calls, text = await drained(generation)
    finally:
        await session.aclose()
    assert generation.user_initiated
    assert calls == [] and text == GREETING, (calls, text)  # no tool, no output to answer


class WeatherAgent(Agent):
    def __init__(self) -> None:
        super().__init__(instructions="Answer briefly.", tools=[get_weather])


async def test_agent_session_run_with_a_tool(
    tool_server: LiveServer, chat_standin: ChatStandin, http: None
) -> None:
    before = len(chat_standin.requests)
    async with AgentSession(llm=realtime(tool_server, modalities=["text"])) as session:
        await session.start(WeatherAgent())
        async with asyncio.timeout(60):
            result = await session.run(user_input="What is the weather in Paris?")
    result.expect.next_event().is_function_call(name="get_weather", arguments=WEATHER_ARGUMENTS)
    result.expect.next_event().is_function_call_output()
    said = result.expect.next_event().is_message(role="assistant").event().item
    assert said.text_content == ANSWER, said
    result.expect.no_more_events()
    outputs = [m for m in chat_standin.requests[-1]["messages"] if m.get("role") == "tool"]
    assert json.loads(outputs[-1]["content"]) == {"sky": "sunny", "city": "Paris"}, outputs
    assert len(chat_standin.requests) - before == 2  # the call, then the answer

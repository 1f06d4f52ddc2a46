"""pipecat (`pipecat-ai[openai]`, pyproject.toml: clients) against a real server: its
`OpenAIRealtimeLLMService` in a conversation with a function tool (the LLM behind voxserve's
`openai` responder is the chat-completions stand-in), its `OpenAISTTService` and
`OpenAITTSService` on the HTTP doors, and its `OpenAIRealtimeSTTService` on a transcription
session. pipecat runs without a transport (tests/clients/pipecat_harness.py)."""

from __future__ import annotations

import json
from typing import Any

from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    FunctionCallResultFrame,
    LLMFullResponseEndFrame,
    LLMRunFrame,
    OutputAudioRawFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStoppedFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.services.openai.stt import OpenAIRealtimeSTTService, OpenAISTTService
from pipecat.services.openai.tts import OpenAITTSService

from tests.chat_standin import REUSED_ID, WEATHER_ARGUMENTS, ChatStandin, chat_fixtures
from tests.clients.audio import question_pcm, question_text, rms
from tests.clients.pipecat_harness import Collector, running, speak
from tests.conftest import LiveServer
from tests.helpers import wer

RATE = 24_000
WEATHER = FunctionSchema(
    name="get_weather",
    description="The weather in a city.",
    properties={"city": {"type": "string"}},
    required=["city"],
)

# a stand-in that gives every tool call the same id, as some local servers do
chat_standin, tool_server = chat_fixtures(reuse_ids=True)


def no_errors(frames: list[Frame]) -> None:
    errors = [f for f in frames if isinstance(f, ErrorFrame)]
    assert not errors, errors


def audio_after(frames: list[Frame], index: int) -> bytes:
    return b"".join(f.audio for f in frames[index:] if isinstance(f, OutputAudioRawFrame))


async def test_realtime_llm_answers_a_greeting_and_a_spoken_turn_through_the_tool(
    tool_server: LiveServer, chat_standin: ChatStandin
) -> None:
    asked: list[dict[str, Any]] = []

    async def get_weather(params: FunctionCallParams) -> None:
        asked.append(dict(params.arguments))
        await params.result_callback({"sky": "sunny"})

    llm = OpenAIRealtimeLLMService(
        api_key="x", base_url=f"ws://127.0.0.1:{tool_server.settings.port}/v1/realtime"
    )
    llm.register_function("get_weather", get_weather)
    context = LLMContext(
        [{"role": "system", "content": "Answer briefly."}], tools=ToolsSchema([WEATHER])
    )
    pair = LLMContextAggregatorPair(context)
    before = len(chat_standin.requests)

    def answered(turns: int) -> Any:
        def check(frames: list[Frame]) -> bool:
            results = [i for i, f in enumerate(frames) if isinstance(f, FunctionCallResultFrame)]
            ends = [i for i, f in enumerate(frames) if isinstance(f, LLMFullResponseEndFrame)]
            return len(results) >= turns and any(
                e > results[turns - 1] and audio_after(frames[: e + 1], results[turns - 1])
                for e in ends
            )

        return check

    between = Collector()  # the assistant aggregator keeps the results and response ends
    async with running(pair.user(), llm, between, pair.assistant(), rate=RATE) as (worker, sink):
        await worker.queue_frame(LLMRunFrame())  # the greeting: the model speaks first
        await sink.until(answered(1), limit_s=60)
        greeting_end = len(sink.frames)
        await speak(worker, question_pcm(RATE), RATE)
        await sink.until(answered(2), limit_s=60)
    no_errors(sink.frames)
    # Each turn: one call, its one result, then the answer spoken (the stand-in reused the id).
    assert asked == [WEATHER_ARGUMENTS, WEATHER_ARGUMENTS], asked
    assert chat_standin.call_ids[-2:] == [REUSED_ID, REUSED_ID], chat_standin.call_ids
    assert len(sink.of(FunctionCallResultFrame)) == 2
    reply = audio_after(sink.frames, greeting_end)
    assert len(reply) > RATE and rms(reply) > 300, (len(reply), rms(reply))
    spoken = [chat_standin.requests[i] for i in range(before, len(chat_standin.requests))]
    assert len(spoken) == 4, [len(r["messages"]) for r in spoken]  # call, answer, call, answer
    outputs = [m for m in spoken[-1]["messages"] if m.get("role") == "tool"]
    assert [json.loads(m["content"]) for m in outputs] == [{"sky": "sunny"}] * 2, spoken[-1]
    users = [m for m in spoken[-1]["messages"] if m.get("role") == "user"]
    assert users and wer(question_text(), str(users[-1]["content"])) <= 0.2, users


async def test_stt_service_transcribes_a_segment(tool_server: LiveServer) -> None:
    stt = OpenAISTTService(
        api_key="x",
        base_url=f"{tool_server.http_url}/v1",
        settings=OpenAISTTService.Settings(model="whisper-1"),
    )
    async with running(stt, rate=16_000) as (worker, sink):
        await worker.queue_frame(VADUserStartedSpeakingFrame())
        await speak(worker, question_pcm(16_000, pad_s=0.2), 16_000, speed=20.0)
        await worker.queue_frame(VADUserStoppedSpeakingFrame())
        await sink.until(lambda frames: bool(sink.of(TranscriptionFrame)))
    no_errors(sink.frames)
    heard = sink.of(TranscriptionFrame)
    assert len(heard) == 1 and wer(question_text(), heard[0].text) <= 0.2, heard


async def test_tts_service_speaks(tool_server: LiveServer) -> None:
    tts = OpenAITTSService(api_key="x", base_url=f"{tool_server.http_url}/v1", voice="alloy")
    async with running(tts, rate=RATE) as (worker, sink):
        await worker.queue_frame(TTSSpeakFrame("It is sunny in Paris today."))
        await sink.until(lambda frames: bool(sink.of(TTSStoppedFrame)))
    no_errors(sink.frames)
    audio = b"".join(f.audio for f in sink.of(TTSAudioRawFrame))
    assert len(audio) > RATE and rms(audio) > 300, (len(audio), rms(audio))
    assert {f.sample_rate for f in sink.of(TTSAudioRawFrame)} == {RATE}


async def test_realtime_stt_service_transcribes_over_a_transcription_session(
    tool_server: LiveServer,
) -> None:
    stt = OpenAIRealtimeSTTService(
        api_key="x",
        base_url=f"ws://127.0.0.1:{tool_server.settings.port}/v1/realtime",
        settings=OpenAIRealtimeSTTService.Settings(model="whisper-1"),
    )
    async with running(stt, rate=RATE) as (worker, sink):
        await worker.queue_frame(VADUserStartedSpeakingFrame())
        await speak(worker, question_pcm(RATE, pad_s=0.2), RATE, speed=10.0)
        await worker.queue_frame(VADUserStoppedSpeakingFrame())  # local VAD: commit
        await sink.until(lambda frames: bool(sink.of(TranscriptionFrame)))
    no_errors(sink.frames)
    heard = sink.of(TranscriptionFrame)
    assert len(heard) == 1 and wer(question_text(), heard[0].text) <= 0.2, heard

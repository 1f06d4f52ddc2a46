"""The output side of a conversation session (the Realtime API) without a socket: a Session
on fake engines, driven through its listener's hooks and the client's control messages
(session_input.apply_control), and what comes out of its outbox, in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import numpy as np
import pytest

from tests.fakes import FakeTts, SlowResponder, fake_runtime, silence, tone
from tests.helpers import eventually
from tests.test_openai_responder import FakeLlm, stream, tool_call_stream, tool_round
from voxserve.config import load_settings
from voxserve.engines.base import ChatMessage, ReplyRequest, ToolCall, ToolCallDelta
from voxserve.engines.openai_responder import OpenAIResponder
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import (
    AudioCleared,
    BargeIn,
    CancelMessage,
    ConversationConfig,
    CreateItem,
    CreateResponse,
    DeleteItem,
    ErrorEvent,
    Event,
    FunctionCallDelta,
    FunctionCallDone,
    Item,
    ItemAdded,
    ItemDeleted,
    ItemDone,
    ItemTruncated,
    ResponseDelta,
    ResponseDone,
    ResponseOptions,
    ResponseStarted,
    ResponseText,
    SessionEnded,
    SessionUpdate,
    SessionUpdated,
    StreamConfig,
    ToolSpec,
    TranscriptFinal,
    TruncateItem,
    TtsEnd,
    TtsStart,
    TurnDetection,
    event_type,
    reply_item_id,
    speech_item_id,
)
from voxserve.pipeline.conversation.responses import Responses
from voxserve.pipeline.conversation.state import Conversation, message_item, simple_turns
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.session import Session
from voxserve.pipeline.synthesis.speaker import spoken_text
from voxserve.server.session.input import apply_control
from voxserve.types import EngineInfo

Script = list[str | ToolCallDelta]
SERVER_VAD = TurnDetection()


class FakeConversant:
    """A responder that reads the conversation and may call tools: each reply plays the
    next script (text pieces and tool-call pieces), `delay_s` apart; every request is kept."""

    info = EngineInfo("responder", "fake-conversant", "tests", "0", "n/a")

    def __init__(self, *scripts: Script, delay_s: float = 0.0) -> None:
        self.scripts = list(scripts)
        self.delay_s = delay_s
        self.requests: list[ReplyRequest] = []
        self.closed = 0  # streams closed (finished or stopped)

    async def respond(self, text: str, history: Sequence[tuple[str, str]]) -> AsyncIterator[str]:
        raise AssertionError("a conversation session calls converse")
        yield ""  # pragma: no cover

    async def converse(self, request: ReplyRequest) -> AsyncIterator[str | ToolCallDelta]:
        self.requests.append(request)
        script = self.scripts.pop(0)
        try:
            for piece in script:
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                yield piece
        finally:
            self.closed += 1


class FailingConversant(FakeConversant):
    async def converse(self, request: ReplyRequest) -> AsyncIterator[str | ToolCallDelta]:
        yield "Well. "
        raise VoxError(ErrorCode.ENGINE_ERROR, "the model went away", stage="responder")


class Run:
    """A running conversation session and everything it sent, as it comes."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.items: list[Event | bytes] = []
        self._reader: asyncio.Task[None] | None = None
        self._runner: asyncio.Task[None] | None = None

    @property
    def responses(self) -> Responses:
        assert self.session.responses is not None
        return self.session.responses

    @property
    def events(self) -> list[Event]:
        return [item for item in self.items if isinstance(item, Event)]

    def of(self, kind: type[Any]) -> list[Any]:
        return [event for event in self.events if isinstance(event, kind)]

    def types(self, *, after: int = 0) -> list[str]:
        return [event_type(e) for e in self.events[after:]]

    async def start(self) -> None:
        await self.start_reading()
        self._runner = asyncio.create_task(self.session.run())
        await asyncio.sleep(0.02)  # the session's task group is up

    async def start_reading(self) -> None:
        outbox = self.session.outbox

        async def read() -> None:
            while (item := await outbox.next()) is not None:
                self.items.append(item)

        self._reader = asyncio.create_task(read())

    async def until(self, check: Callable[[], object], timeout_s: float = 5.0) -> None:
        await eventually(check, timeout_s)

    async def flush(self) -> None:
        """Until the reader has taken everything sent so far."""
        await eventually(lambda: not self.session.outbox.qsize())
        await asyncio.sleep(0)  # the reader appends what it took

    async def done(self, count: int = 1) -> None:
        await self.until(lambda: len(self.of(ResponseDone)) >= count)

    async def stop(self) -> None:
        await self.session.end_input()
        assert self._runner is not None and self._reader is not None
        await asyncio.wait_for(self._runner, 5)
        await asyncio.wait_for(self._reader, 5)


def conversation(
    *,
    responds: bool = True,
    detection: TurnDetection | None = SERVER_VAD,
    modalities: tuple[Any, ...] = ("audio",),
    tools: tuple[ToolSpec, ...] | None = None,
) -> ConversationConfig:
    return ConversationConfig(
        responds=responds,
        turn_detection=detection,
        response=ResponseOptions(output_modalities=modalities, tools=tools),
    )


def make_session(
    responder: object | None = None, config: ConversationConfig | None = None, **engines: Any
) -> Session:
    runtime = fake_runtime(load_settings(log_level="warning"), responder=responder, **engines)
    stream = StreamConfig(mode="assistant", conversation=config or conversation())
    return Session(runtime.session_context(), stream, Outbox(4096))


async def started(responder: object | None = None, **options: Any) -> Run:
    run = Run(make_session(responder, **options))
    await run.start()
    return run


async def spoken_turn(run: Run, segment: int, text: str) -> None:
    """What the listener does for a turn: commit it, then its final transcript."""
    await run.responses.user_committed(segment)
    await run.responses.user_final(segment, text)


# --- a spoken turn, answered -------------------------------------------------------------


async def test_a_spoken_turn_is_kept_then_answered_in_the_documented_order() -> None:
    run = await started()  # the echo responder: the reply is the user's text
    try:
        await spoken_turn(run, 0, "hello there")
        await run.done()
        user_id = speech_item_id(run.session.id, 0)
        answer_id = reply_item_id(run.session.id, 1)
        assert run.types() == [
            "item.added",
            "item.done",
            "response.started",
            "item.added",
            "response.delta",
            "tts.start",
            "tts.end",
            "response.text",
            "item.done",
            "response.done",
        ]
        added_user, done_user, started_, added_answer = run.events[:4]
        assert isinstance(added_user, ItemAdded) and added_user.item.text is None
        assert added_user.item.audio and added_user.item.role == "user"
        assert added_user.item.id == user_id and added_user.previous_item_id is None
        assert isinstance(done_user, ItemDone) and done_user.item.text == "hello there"
        assert started_ == ResponseStarted(
            reply=1,
            item_id=answer_id,
            output_modalities=("audio",),
            voice="fake",
            in_conversation=True,
            voice_name="fake",
        )
        assert isinstance(added_answer, ItemAdded) and added_answer.previous_item_id == user_id
        assert added_answer.item.status == "in_progress" and added_answer.item.audio
        (text,) = run.of(ResponseText)
        (done,) = run.of(ResponseDone)
        assert text.reply == 1 and text.text == "hello there"
        assert done.status == "completed" and done.reason is msgspec_unset()
        (answer,) = done.output
        assert (answer.id, answer.status, answer.text) == (answer_id, "completed", "hello there")
        assert any(isinstance(item, bytes) for item in run.items)  # it was spoken
        assert [item.id for item in run.responses.conversation] == [user_id, answer_id]
        # the next turn is reply 2 (a per-session counter, not the segment)
        await spoken_turn(run, 1, "again")
        await run.done(2)
        assert [e.reply for e in run.of(ResponseStarted)] == [1, 2]
    finally:
        await run.stop()


def msgspec_unset() -> object:
    from voxserve.events import UNSET

    return UNSET


async def test_speech_through_the_listener_is_answered_before_the_session_ends() -> None:
    """Real turn detection on fake engines: the listener's hooks are the session's."""
    run = await started()
    session = run.session
    listener, responses = session.listener, run.responses
    assert listener is not None and listener.last_item_id is not None
    assert listener.on_commit == responses.user_committed
    assert listener.on_failed == responses.user_failed
    audio = np.concatenate([silence(0.3), tone(440, 1.0), silence(0.8)])
    for seq, at in enumerate(range(0, audio.size, 320)):
        await session.feed_audio(seq, memoryview(audio[at : at + 320].tobytes()))
    await run.stop()  # end of input: the turn is finished and answered first
    events = run.events
    final = next(e for e in events if isinstance(e, TranscriptFinal))
    added, done = run.of(ItemAdded)[0], run.of(ItemDone)[0]
    assert added.item.id == done.item.id == speech_item_id(session.id, 0)
    assert (final.text, done.item.text) == ("tone440", "tone440")
    assert events.index(final) < events.index(done) < events.index(run.of(ResponseStarted)[0])
    assert run.of(ResponseText)[0].text == "tone440"
    assert isinstance(events[-1], SessionEnded) and isinstance(events[-2], ResponseDone)
    assert events[-1].replies == 1
    assert responses.conversation.last_id() == reply_item_id(session.id, 1)  # a commit's prev


async def test_push_to_talk_answers_only_on_request() -> None:
    run = await started(config=conversation(detection=None))
    try:
        await spoken_turn(run, 0, "question")
        await asyncio.sleep(0.1)
        assert not run.of(ResponseStarted)
        await apply_control(run.session, CreateResponse())
        await run.done()
        assert run.of(ResponseText)[0].text == "question"
    finally:
        await run.stop()


async def test_a_transcription_session_never_answers() -> None:
    run = await started(config=conversation(responds=False))
    try:
        await spoken_turn(run, 0, "just transcribe me")
        with pytest.raises(VoxError) as refused:
            await apply_control(run.session, CreateResponse())
        assert refused.value.code is ErrorCode.WRONG_MODE and not refused.value.fatal
        await asyncio.sleep(0.1)
        assert run.types() == ["item.added", "item.done"]
    finally:
        await run.stop()


async def test_a_failed_or_empty_transcription_completes_the_item_and_is_not_answered() -> None:
    run = await started()
    try:
        await run.responses.user_committed(0)
        await run.responses.user_failed(0, VoxError(ErrorCode.STAGE_TIMEOUT, "asr too slow"))
        await spoken_turn(run, 1, "")
        await asyncio.sleep(0.1)
        assert run.types() == ["item.added", "item.done", "item.added", "item.done"]
        failed, empty = run.of(ItemDone)
        assert failed.item.text is None and empty.item.text == ""
    finally:
        await run.stop()


async def test_a_final_with_no_commit_hook_still_adds_the_item_first() -> None:
    run = await started(config=conversation(detection=None))
    try:
        await run.responses.user_final(3, "late")
        await run.until(lambda: len(run.events) >= 2)
        assert run.types() == ["item.added", "item.done"]
        assert run.of(ItemAdded)[0].item.id == speech_item_id(run.session.id, 3)
    finally:
        await run.stop()


# --- responses on request ------------------------------------------------------------------


async def test_a_text_only_response_sends_no_audio() -> None:
    run = await started()
    try:
        await apply_control(run.session, CreateItem("message", role="user", text="write it"))
        options = ResponseOptions(output_modalities=("text",))
        await apply_control(run.session, CreateResponse(options))
        await run.done()
        assert not run.of(TtsStart) and not any(isinstance(i, bytes) for i in run.items)
        assert run.of(ResponseStarted)[0].output_modalities == ("text",)
        (done,) = run.of(ResponseDone)
        assert done.output[0].text == "write it" and not done.output[0].audio
    finally:
        await run.stop()


async def test_a_second_response_while_one_runs_is_refused_not_dropped() -> None:
    run = await started(SlowResponder(words=4, delay_s=0.05))
    try:
        await apply_control(run.session, CreateItem("message", role="user", text="hi"))
        await apply_control(run.session, CreateResponse())
        with pytest.raises(VoxError) as refused:
            await apply_control(run.session, CreateResponse())
        assert refused.value.code is ErrorCode.RESPONSE_ACTIVE
        assert refused.value.code.value == "conversation_already_has_active_response"
        await run.done()
        assert [e.status for e in run.of(ResponseDone)] == ["completed"]
        await apply_control(run.session, CreateResponse())  # after its end: fine
        await run.done(2)
    finally:
        await run.stop()


async def test_overrides_reach_the_responder_and_an_out_of_band_response_is_not_kept() -> None:
    tools = (ToolSpec("lookup", "find a thing", {"type": "object"}),)
    bot = FakeConversant(["Kept. "], ["Aside. "])
    run = await started(bot, config=conversation(tools=tools))
    try:
        await apply_control(run.session, CreateItem("message", role="user", text="hi"))
        await apply_control(run.session, CreateResponse())
        await run.done()
        options = ResponseOptions(
            instructions="Be terse.",
            tools=(),
            tool_choice="none",
            output_modalities=("text",),
            max_output_tokens=7,
            in_conversation=False,
        )
        await apply_control(run.session, CreateResponse(options))
        await run.done(2)
        first, second = bot.requests
        assert first.tools == tools and first.instructions is None
        assert first.messages == (ChatMessage("user", "hi"),)
        assert second == ReplyRequest(
            messages=(ChatMessage("user", "hi"), ChatMessage("assistant", "Kept.")),
            instructions="Be terse.",
            tools=(),
            tool_choice="none",
            max_output_tokens=7,
        )
        aside = run.of(ResponseDone)[1].output[0]
        assert aside.text == "Aside."
        assert aside.id not in [item.id for item in run.responses.conversation]
        assert run.of(ResponseStarted)[1].in_conversation is False
    finally:
        await run.stop()


async def test_a_responder_failure_is_the_error_then_a_failed_response_done() -> None:
    run = await started(FailingConversant())
    try:
        await apply_control(
            run.session, CreateResponse(ResponseOptions(output_modalities=("text",)))
        )
        await run.done()
        assert run.types() == [
            "response.started",
            "item.added",
            "response.delta",
            "error",
            "item.done",
            "response.done",
        ]
        error = run.of(ErrorEvent)[0]
        done = run.events[-1]
        assert isinstance(done, ResponseDone)
        assert run.events.index(error) < run.events.index(done)
        assert (error.code, error.reply) == ("engine_error", 1)
        assert (done.status, done.code, done.message) == (
            "failed",
            "engine_error",
            "the model went away",
        )
        assert done.output[0].status == "incomplete" and done.output[0].text == "Well."
    finally:
        await run.stop()


# --- cancellation and barge-in -------------------------------------------------------------


async def test_the_clients_cancel_stops_the_model_work_and_ends_the_response() -> None:
    script: Script = [f"Sentence {n}. " for n in range(40)]
    bot = FakeConversant(script, delay_s=0.03)
    run = await started(bot)
    try:
        await apply_control(run.session, CreateResponse())
        await run.until(lambda: run.of(TtsStart))
        await apply_control(run.session, CancelMessage())
        await run.done()
        assert bot.closed == 1 and len(run.of(ResponseDelta)) < len(script)
        done = run.events[-1]
        assert isinstance(done, ResponseDone) and done.status == "cancelled"
        assert done.reason == "client_cancelled"
        (tts_end,) = run.of(TtsEnd)
        assert tts_end.interrupted
        with pytest.raises(VoxError) as refused:  # nothing left to cancel
            await apply_control(run.session, CancelMessage())
        assert refused.value.code is ErrorCode.RESPONSE_NOT_ACTIVE and not refused.value.fatal
    finally:
        await run.stop()


async def test_a_cancel_before_the_response_began_still_frames_it() -> None:
    run = await started()
    try:
        run.session.create_response(ResponseOptions())
        await run.session.cancel()
        await run.done()
        assert run.types() == ["response.started", "response.done"]
        assert run.of(ResponseDone)[0].reason == "client_cancelled"
    finally:
        await run.stop()


async def test_a_cancel_while_its_start_waits_for_a_slow_reader_still_frames_it() -> None:
    """The client reads nothing for a while: the response's ResponseStarted waits for room
    in the outbox when the cancel comes; it still goes out, before the ResponseDone."""
    run = Run(make_session(config=conversation(modalities=("text",))))
    outbox = run.session.outbox
    runner = asyncio.create_task(run.session.run())
    await asyncio.sleep(0.02)  # the session's task group is up
    filler = 0
    while outbox.event_nowait(AudioCleared()):  # the outbox is full: every put waits
        filler += 1
    run.session.create_response(ResponseOptions())
    await asyncio.sleep(0.02)  # its ResponseStarted waits for room
    await run.session.cancel()
    run._runner = runner
    await run.start_reading()
    try:
        await run.done()
        assert run.types(after=filler) == ["response.started", "response.done"]
        assert run.of(ResponseDone)[0].reason == "client_cancelled"
    finally:
        await run.stop()


async def test_a_cancel_while_an_item_waits_for_a_slow_reader_still_announces_it() -> None:
    """The cancel lands while the assistant item's ItemAdded waits for room in the outbox:
    the client still gets it before the ItemDone that ends the item (and nothing after)."""
    bot = FakeConversant(["Hello ", "there."], delay_s=0.2)
    run = Run(make_session(bot, config=conversation(modalities=("text",))))
    outbox = run.session.outbox
    run._runner = asyncio.create_task(run.session.run())
    await asyncio.sleep(0.02)  # the session's task group is up
    run.session.create_response(ResponseOptions())
    await asyncio.sleep(0.05)  # its ResponseStarted is out, the responder thinks
    while outbox.event_nowait(AudioCleared()):  # the outbox is full: every put waits
        pass
    await asyncio.sleep(0.3)  # the first text: its ItemAdded waits for room
    await run.session.cancel()
    await run.start_reading()
    try:
        await run.done()
        kinds = [kind for kind in run.types() if kind != event_type(AudioCleared())]
        assert kinds == ["response.started", "item.added", "item.done", "response.done"]
        (done,) = run.of(ItemDone)
        assert done.item.status == "incomplete"
        assert run.of(ResponseDone)[0].reason == "client_cancelled"
    finally:
        await run.stop()


async def test_barge_in_keeps_the_item_cut_to_what_its_audio_said() -> None:
    words = [f"word{n}" for n in range(30)]
    bot = FakeConversant([f"{word}. " for word in words], delay_s=0.02)
    run = await started(bot, tts=FakeTts(seconds_per_word=0.1))
    try:
        await spoken_turn(run, 0, "tell me")
        await run.until(lambda: len([i for i in run.items if isinstance(i, bytes)]) >= 6)
        await run.responses.speech_started(1)
        await run.done()
        (barge,) = run.of(BargeIn)
        mark = run.events.index(barge)
        assert not any(isinstance(i, bytes) for i in run.items[run.items.index(barge) :])
        assert run.types(after=mark) == ["barge_in", "tts.end", "item.done", "response.done"]
        barge, tts_end, item_done, done = run.events[mark:]
        assert isinstance(barge, BargeIn) and barge.segment == 1
        assert isinstance(tts_end, TtsEnd) and tts_end.interrupted
        assert isinstance(item_done, ItemDone) and isinstance(done, ResponseDone)
        assert (done.status, done.reason) == ("cancelled", "turn_detected")
        said = item_done.item.text
        assert item_done.item.status == "incomplete" and said is not None
        # one sentence of one word per 100 ms of audio: the words whose audio went out
        assert said.split() == [f"{w}." for w in words[: tts_end.audio_ms // 100]]
        assert 0 < len(said.split()) < len(words)
        kept = run.responses.conversation.get(item_done.item.id)
        assert kept is not None and kept.text == said  # the history keeps the cut text
        assert bot.closed == 1
    finally:
        await run.stop()


async def test_speech_while_a_finished_reply_is_audible_is_a_barge_in_only() -> None:
    """Its ResponseDone is out: the reply is not changed again (the client truncates what
    it did not play, as with OpenAI), but the client is told to stop playing."""
    run = await started()
    try:
        await spoken_turn(run, 0, "one two three four five six seven eight")
        await run.done()
        assert run.session.speaker.audible()  # sent ahead of playback by the pacing lead
        await run.responses.speech_started(1)
        await run.flush()
        assert run.types()[-2:] == ["response.done", "barge_in"]
        assert run.of(ResponseDone)[0].status == "completed"
        await spoken_turn(run, 1, "next")
        await run.done(2)
        user = run.of(ItemAdded)[2]  # the second turn follows the first reply
        assert user.previous_item_id == reply_item_id(run.session.id, 1)
    finally:
        await run.stop()


async def test_without_interrupt_response_speech_does_not_cancel() -> None:
    detection = TurnDetection(interrupt_response=False)
    run = await started(
        SlowResponder(words=5, delay_s=0.02), config=conversation(detection=detection)
    )
    try:
        await spoken_turn(run, 0, "go on")
        await run.until(lambda: run.of(ResponseDelta))
        await run.responses.speech_started(1)
        await run.done()
        assert not run.of(BargeIn)
        assert run.of(ResponseDone)[0].status == "completed"
    finally:
        await run.stop()


# --- tools ---------------------------------------------------------------------------------


async def test_a_tool_call_streams_out_and_its_output_goes_back_to_the_responder() -> None:
    call_script: Script = [
        ToolCallDelta(0, call_id="call_1", name="weather"),
        ToolCallDelta(0, arguments='{"city": '),
        ToolCallDelta(0, arguments='"Oslo"}'),
    ]
    bot = FakeConversant(call_script, ["It is sunny. "])
    tools = (ToolSpec("weather", "the weather", {"type": "object"}),)
    run = await started(bot, config=conversation(tools=tools))
    try:
        await spoken_turn(run, 0, "weather in Oslo?")
        await run.done()
        mark = 2  # after the user item's added/done
        assert run.types(after=mark) == [
            "response.started",
            "item.added",
            "function_call.delta",
            "function_call.delta",
            "function_call.done",
            "item.done",
            "response.done",
        ]
        added = run.of(ItemAdded)[1].item
        # the session's own call id (the model's may repeat), shown to the model as its own
        assert (added.kind, added.status, added.call_id, added.name) == (
            "function_call",
            "in_progress",
            f"call_{added.id}",
            "weather",
        )
        deltas = run.of(FunctionCallDelta)
        assert [d.delta for d in deltas] == ['{"city": ', '"Oslo"}']
        (call_done,) = run.of(FunctionCallDone)
        assert call_done.arguments == '{"city": "Oslo"}' and call_done.item_id == added.id
        (done,) = run.of(ResponseDone)
        assert [item.kind for item in done.output] == ["function_call"]
        # the client runs the tool and asks again
        await apply_control(
            run.session,
            CreateItem("function_call_output", call_id=added.call_id, output='{"sky": "clear"}'),
        )
        await apply_control(run.session, CreateResponse())
        await run.done(2)
        assert bot.requests[1].messages == (
            ChatMessage("user", "weather in Oslo?"),
            ChatMessage(
                "assistant", tool_calls=(ToolCall("call_1", "weather", '{"city": "Oslo"}'),)
            ),
            ChatMessage("tool", '{"sky": "clear"}', call_id="call_1"),
        )
        assert run.of(ResponseText)[0].text == "It is sunny."
    finally:
        await run.stop()


async def test_a_tool_round_trip_through_a_chat_completions_server() -> None:
    """OpenAIResponder against a local stub: the model first calls tools, the client
    answers one call and asks again; the second request holds the user turn, the call and
    its output (the unanswered call is left out, as strict chat APIs want)."""
    llm = FakeLlm()
    await llm.start()
    answers = [tool_call_stream(), stream(["It is sunny in Oslo."])]

    async def handler(server: FakeLlm, reader: Any, writer: Any) -> bool:
        return await answers[len(server.requests) - 1](server, reader, writer)

    llm.handler = handler
    bot = OpenAIResponder(base_url=llm.base_url, trust_env=False, system_prompt="Default.")
    tools = (ToolSpec("weather", "The weather.", {"type": "object"}), ToolSpec("time"))
    run = await started(bot, config=conversation(tools=tools))
    try:
        await spoken_turn(run, 0, "weather in Oslo?")
        await run.done()
        calls = run.of(FunctionCallDone)
        assert [(c.call_id, c.name, c.arguments) for c in calls] == [
            (f"call_{c.item_id}", name, arguments)
            for c, name, arguments in zip(
                calls, ("weather", "time"), ('{"city": "Oslo"}', "{}"), strict=True
            )
        ]
        assert not run.of(ResponseText)  # only tool calls: no assistant message
        answer = calls[0].call_id
        output = CreateItem("function_call_output", call_id=answer, output='{"sky": "clear"}')
        await apply_control(run.session, output)
        await apply_control(run.session, CreateResponse())
        await run.done(2)
        assert run.of(ResponseText)[0].text == "It is sunny in Oslo."
        first, second = llm.requests
        assert first.body["tools"][1] == {"type": "function", "function": {"name": "time"}}
        assert first.body["messages"] == [
            {"role": "system", "content": "Default."},
            {"role": "user", "content": "weather in Oslo?"},
        ]
        assert second.body["messages"] == [
            {"role": "system", "content": "Default."},
            {"role": "user", "content": "weather in Oslo?"},
            *tool_round("call_abc", "weather", '{"city": "Oslo"}', '{"sky": "clear"}'),
        ]
    finally:
        await run.stop()
        await bot.aclose()
        await llm.stop()


async def test_rules_and_echo_answer_without_tools() -> None:
    tools = (ToolSpec("weather"),)
    run = await started(config=conversation(tools=tools))  # echo
    try:
        await spoken_turn(run, 0, "no tools here")
        await run.done()
        assert not run.of(FunctionCallDelta)
        assert run.of(ResponseText)[0].text == "no tools here"
    finally:
        await run.stop()


# --- the client's items ----------------------------------------------------------------


async def test_items_are_created_deleted_and_truncated_or_refused_with_a_code() -> None:
    run = await started()
    session = run.session

    async def refused(message: object) -> ErrorCode:
        with pytest.raises(VoxError) as caught:
            await apply_control(session, message)  # type: ignore[arg-type]
        assert not caught.value.fatal
        return caught.value.code

    try:
        await apply_control(session, CreateItem("message", item_id="a", role="user", text="A"))
        await apply_control(session, CreateItem("message", item_id="c", role="user", text="C"))
        await apply_control(
            session,
            CreateItem("message", item_id="b", previous_item_id="a", role="system", text="B"),
        )
        assert [i.id for i in run.responses.conversation] == ["a", "b", "c"]
        await run.flush()
        added = run.of(ItemAdded)
        assert [(e.item.id, e.previous_item_id) for e in added] == [
            ("a", None),
            ("c", "a"),
            ("b", "a"),
        ]
        assert [e.item.id for e in run.of(ItemDone)] == ["a", "c", "b"]
        invalid = ErrorCode.INVALID_PARAMETER
        assert await refused(CreateItem("message", item_id="a", role="user")) is invalid
        assert await refused(CreateItem("message", previous_item_id="zz", role="user")) is invalid
        assert await refused(CreateItem("message", text="no role")) is invalid
        ours = reply_item_id(session.id, 9)  # a reply's id to come
        assert await refused(CreateItem("message", item_id=ours, role="user")) is invalid
        assert await refused(CreateItem("function_call_output", output="x")) is invalid
        assert await refused(CreateItem("function_call", call_id="c1")) is invalid
        too_long = CreateItem("message", role="user", text="x" * 5000)
        assert await refused(too_long) is ErrorCode.TEXT_TOO_LONG
        assert await refused(DeleteItem("zz")) is invalid
        assert await refused(TruncateItem("a", 0, 10)) is invalid  # not assistant audio
        assert await refused(TruncateItem("zz", 0, 10)) is invalid
        await apply_control(session, DeleteItem("b"))
        await run.flush()
        assert run.of(ItemDeleted) == [ItemDeleted(item_id="b")]
        assert [i.id for i in run.responses.conversation] == ["a", "c"]
        # a spoken reply, then the client's truncation of it
        await apply_control(session, CreateResponse())  # echo: "C"... of the last user text
        await run.done()
        answer = run.of(ResponseDone)[0].output[0]
        audio_ms = run.of(TtsEnd)[0].audio_ms
        assert await refused(TruncateItem(answer.id, 0, audio_ms + 100)) is invalid
        assert await refused(TruncateItem(answer.id, 1, 0)) is invalid
        await apply_control(session, TruncateItem(answer.id, 0, 0))
        await run.flush()
        assert run.of(ItemTruncated) == [
            ItemTruncated(item_id=answer.id, content_index=0, audio_end_ms=0)
        ]
        kept = run.responses.conversation.get(answer.id)
        assert kept is not None and kept.text == ""  # nothing of it was heard
    finally:
        await run.stop()


async def test_conversation_messages_in_a_stream_session_are_refused() -> None:
    runtime = fake_runtime(load_settings(log_level="warning"))
    session = Session(runtime.session_context(), StreamConfig(mode="assistant"), Outbox(64))
    try:
        for message in (
            CreateItem("message", role="user", text="x"),
            DeleteItem("x"),
            TruncateItem("x", 0, 0),
            CreateResponse(),
            SessionUpdate(StreamConfig(mode="assistant")),
        ):
            with pytest.raises(VoxError) as refused:
                await apply_control(session, message)
            assert refused.value.code is ErrorCode.WRONG_MODE
        await session.cancel()  # /v1/stream: a cancel with nothing to cancel is fine
    finally:
        session.release()


# --- session.update ----------------------------------------------------------------------


async def test_session_update_applies_the_output_side_or_changes_nothing() -> None:
    run = await started()
    session = run.session
    try:
        base = session.config
        with pytest.raises(VoxError) as refused:
            await apply_control(session, SessionUpdate(_with(base, voice="nobody")))
        assert refused.value.code is ErrorCode.UNKNOWN_VOICE and not refused.value.fatal
        with pytest.raises(VoxError) as refused:
            await apply_control(session, SessionUpdate(_with(base, output_sample_rate=12_345)))
        assert refused.value.code is ErrorCode.UNSUPPORTED_SAMPLE_RATE
        assert session.config is base and not run.of(SessionUpdated)
        quiet = conversation(detection=TurnDetection(create_response=False))
        update = _with(base, output_sample_rate=24_000, conversation=quiet)
        await apply_control(session, SessionUpdate(update))
        await run.flush()
        assert run.of(SessionUpdated) == [SessionUpdated()]
        assert session.config is update and session.output_sample_rate == 24_000
        await spoken_turn(run, 0, "no answer now")
        await asyncio.sleep(0.1)
        assert not run.of(ResponseStarted)
        await apply_control(session, CreateResponse())  # at the new rate
        await run.done()
        assert run.of(TtsStart)[0].sample_rate == 24_000
    finally:
        await run.stop()


def _with(config: StreamConfig, **changes: Any) -> StreamConfig:
    from dataclasses import replace

    return replace(config, **changes)


# --- the conversation itself (pure) ----------------------------------------------------------


def _call(item_id: str, call_id: str) -> Item:
    return Item(id=item_id, kind="function_call", call_id=call_id, name="f", arguments="{}")


def _output(item_id: str, call_id: str) -> Item:
    return Item(id=item_id, kind="function_call_output", call_id=call_id, output="out")


def test_the_responders_view_pairs_calls_with_outputs() -> None:
    talk = Conversation()
    for item in (
        message_item("u1", "user", "question"),
        message_item("a1", "assistant", "Let me look."),
        _call("f1", "c1"),
        _call("f2", "c2"),  # never answered: not shown
        message_item("u2", "user", "while you look"),
        _output("o1", "c1"),  # shown right after its call
        _output("o9", "c9"),  # no such call: a system note
        message_item("s1", "system", "be brief"),
        message_item("u3", "user", None, audio=True),  # not transcribed: not read
    ):
        talk.add(item)
    assert talk.view() == (
        ChatMessage("user", "question"),
        ChatMessage("assistant", "Let me look.", tool_calls=(ToolCall("c1", "f", "{}"),)),
        ChatMessage("tool", "out", call_id="c1"),
        ChatMessage("user", "while you look"),
        ChatMessage("system", "Output of tool call c9: out"),
        ChatMessage("system", "be brief"),
    )
    assert simple_turns(talk.view()) == ("while you look", [("question", "Let me look.")])
    assert simple_turns(()) == ("", [])


def test_the_conversation_is_bounded_and_says_what_left() -> None:
    talk = Conversation(max_items=3, view_chars=8)
    for n in range(3):
        assert talk.add(message_item(f"m{n}", "user", "x" * 4)) == (
            f"m{n - 1}" if n else None,
            [],
        )
    previous, removed = talk.add(message_item("first", "user", "y"), "root")
    assert (previous, removed) == (None, ["m0"])  # the oldest other than the new one
    assert [item.id for item in talk] == ["first", "m1", "m2"]
    # the view: the newest items within 8 characters (the newest always)
    assert talk.view() == (ChatMessage("user", "xxxx"), ChatMessage("user", "xxxx"))
    assert Conversation(view_chars=1).add(message_item("big", "user", "z" * 50))[1] == []


async def test_evicted_items_are_deleted_for_the_client() -> None:
    run = await started()
    try:
        run.responses.conversation.max_items = 2
        for n in range(3):
            await apply_control(run.session, CreateItem("message", role="user", text=str(n)))
        await run.flush()
        (deleted,) = run.of(ItemDeleted)
        assert deleted.item_id == run.of(ItemAdded)[0].item.id
        assert len(run.responses.conversation) == 2
    finally:
        await run.stop()


def test_spoken_text_cuts_at_the_audio_sent() -> None:
    sentences = [(100, "One two. "), (300, "Three four five six. ")]
    assert spoken_text(sentences, 0) == ""
    assert spoken_text(sentences, 100) == "One two."
    assert spoken_text(sentences, 200) == "One two. Three four"
    assert spoken_text(sentences, 10_000) == "One two. Three four five six."

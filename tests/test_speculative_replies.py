"""A speculative reply (Replies.speculate) on its own: what the client sees of it, and how
often the responder is asked, as the listener's pauses, resumes and finals come (fake
engines: this is about the pipeline's bookkeeping, not the models)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence

from tests.fakes import FakeTts, fake_runtime
from voxserve.config import load_settings
from voxserve.engines.responders import EchoResponder
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import BargeIn, ErrorEvent, Event, ResponseText, StreamConfig, TtsStart
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.session import Session
from voxserve.pipeline.turns.replies import Replies


class Asked(EchoResponder):
    """Echoes; records each text asked; `fail` raises instead (a responder's error)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.fail = fail

    async def respond(
        self, text: str, history: Sequence[tuple[str, str]]
    ) -> AsyncGenerator[str, None]:
        self.calls.append(text)
        if self.fail:
            raise VoxError(ErrorCode.ENGINE_ERROR, "the responder failed")
        async for piece in super().respond(text, history):
            yield piece


async def seen(responder: Asked, steps: Callable[[Replies], Awaitable[None]]) -> list[Event]:
    """The events an assistant session's replies send while `steps` run."""
    events, _ = await played(responder, steps)
    return events


async def played(
    responder: Asked, steps: Callable[[Replies], Awaitable[None]], tts: FakeTts | None = None
) -> tuple[list[Event], Session]:
    """`seen`, and the session (its reply counters)."""
    rt = fake_runtime(load_settings(log_level="warning"), responder=responder, tts=tts)
    outbox = Outbox(4096)
    session = Session(rt.session_context(), StreamConfig(mode="assistant"), outbox)
    replies = session.replies
    assert replies is not None
    async with asyncio.TaskGroup() as group:
        replies.group = group
        await steps(replies)
        await asyncio.sleep(0.1)  # a held reply's responder and TTS run meanwhile
        await replies.wait()
    events: list[Event] = []
    while outbox.qsize():
        item = await outbox.next()
        if isinstance(item, Event):
            events.append(item)
    return events, session


async def test_the_same_text_after_a_resume_asks_the_responder_once() -> None:
    responder = Asked()

    async def steps(replies: Replies) -> None:
        await replies.speculate(0, "Turn on the lights.")
        await asyncio.sleep(0.05)
        await replies.withdraw(0)  # a cough: the user "went on"
        await replies.speculate(0, "Turn on the lights.")  # the next pause: the same text
        await replies.start(0, "Turn on the lights.")

    events = await seen(responder, steps)
    assert responder.calls == ["Turn on the lights."]
    assert sum(isinstance(e, TtsStart) for e in events) == 1
    assert sum(isinstance(e, ResponseText) for e in events) == 1


async def test_a_held_reply_is_not_a_barge_in_and_waits_for_its_final() -> None:
    """The next turn starts before the paused one's final is back: nothing was seen, so
    no barge-in; the final then takes the held reply up (asked once)."""
    responder = Asked()

    async def steps(replies: Replies) -> None:
        await replies.speculate(0, "Hello there.")
        await asyncio.sleep(0.05)
        await replies.barge_in(1)
        await replies.start(0, "Hello there.")

    events = await seen(responder, steps)
    assert not [e for e in events if isinstance(e, BargeIn)], events
    assert responder.calls == ["Hello there."]
    assert sum(isinstance(e, ResponseText) for e in events) == 1


async def test_a_held_reply_s_error_is_told_only_once_confirmed() -> None:
    async def withdrawn(replies: Replies) -> None:
        await replies.speculate(0, "Hello")
        await asyncio.sleep(0.05)
        await replies.withdraw(0)
        await replies.start(0, "Hello, how are you?")  # another text: replaced

    async def confirmed(replies: Replies) -> None:
        await replies.speculate(0, "Hello")
        await asyncio.sleep(0.05)
        await replies.start(0, "Hello")

    errors = [e for e in await seen(Asked(fail=True), withdrawn) if isinstance(e, ErrorEvent)]
    assert len(errors) == 1, errors  # the replacement's, not also the speculative one's
    errors = [e for e in await seen(Asked(fail=True), confirmed) if isinstance(e, ErrorEvent)]
    assert len(errors) == 1, errors


async def test_a_reply_no_final_confirms_does_not_hold_the_session_open() -> None:
    """Withdrawn, then the turn's final was empty (no `start`): at the end of input the
    held reply is dropped unseen, not waited for."""

    async def steps(replies: Replies) -> None:
        await replies.speculate(0, "Hello")
        await asyncio.sleep(0.05)
        await replies.withdraw(0)

    async with asyncio.timeout(10):
        events = await seen(Asked(), steps)
    assert not [e for e in events if isinstance(e, TtsStart | ResponseText)], events


async def test_a_confirmed_reply_counts_once_however_early_it_is_confirmed() -> None:
    """The session's `replies`/`interrupted` (session.ended): a speculative reply counts
    once confirmed, whether its first audio was ready then or not (slow TTS), and a confirmed
    one cut before its first chunk is a reply, interrupted; a replaced one is none."""

    def confirmed_early(cut: bool) -> Callable[[Replies], Awaitable[None]]:
        async def steps(replies: Replies) -> None:
            await replies.speculate(0, "Hello there.")
            await replies.start(0, "Hello there.")  # before its first chunk (slow TTS)
            if cut:
                await asyncio.sleep(0.01)
                await replies.barge_in(1)

        return steps

    async def confirmed_late(replies: Replies) -> None:
        await replies.speculate(0, "Hello there.")
        await asyncio.sleep(0.4)  # its first chunk held back, waiting
        await replies.start(0, "Hello there.")

    async def replaced(replies: Replies) -> None:
        await replies.speculate(0, "Hello")
        await asyncio.sleep(0.05)
        await replies.start(0, "Hello, how are you?")

    counts = []
    for steps in (confirmed_early(False), confirmed_early(True), confirmed_late, replaced):
        _, session = await played(Asked(), steps, tts=FakeTts(chunk_delay_s=0.2))
        counts.append((session.speaker.replies, session.speaker.interrupted))
    assert counts == [(1, 0), (1, 1), (1, 0), (1, 0)]

"""A live session's reply turn: one reply at a time, spoken through its Speaker.

tts mode speaks the client's utterances as they come (`speak`); assistant mode answers
each final transcript (`start`): the responder's text streams to the client as it comes and
is spoken sentence by sentence, and speech that starts while a reply runs or is still
audible cancels it (`barge_in`). The (user, assistant) turns are kept for the responder.

A speculative reply (`speculate`, at a pause before the turn is confirmed) runs the
responder and TTS but sends nothing (no response.delta, no tts.start) until its turn's final
confirms it with the same text (`start`: the responder is not asked twice); a different final
replaces it. When the user goes on after the pause (`withdraw`) it is kept, unseen and idle
(its responder and TTS wait on their own back-pressure), until the next pause or the final
says whether its text still holds: the same text again (a cough, a breath taken as speech)
takes it up, so the responder is never asked twice for one text; another replaces it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from functools import partial

from voxserve.errors import ErrorCode, VoxError
from voxserve.events import BargeIn, ResponseDelta, ResponseText
from voxserve.observe.tracing import TurnMarks
from voxserve.pipeline.context import SessionContext
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.streams import SpokenSentences, read_responder
from voxserve.pipeline.synthesis.speaker import Speaker
from voxserve.pipeline.turns.listener import Listener

HISTORY_TURNS = 8  # (user, assistant) turns kept for the responder


class Replies:
    """A session's replies, one at a time (module docstring)."""

    __slots__ = (
        "_held",
        "_history",
        "_task",
        "_withdrawn",
        "ctx",
        "emit_turn",
        "group",
        "listener",
        "outbox",
        "speaker",
    )

    def __init__(
        self,
        ctx: SessionContext,
        outbox: Outbox,
        speaker: Speaker,
        emit_turn: Callable[[TurnMarks], None] | None = None,
    ) -> None:
        """`emit_turn`: where a finished turn's span marks go (tracing on)."""
        self.ctx = ctx
        self.outbox = outbox
        self.speaker = speaker
        self.emit_turn = emit_turn
        # Assistant mode: the listener whose finals are answered (its turn marks, vad.end).
        self.listener: Listener | None = None
        self.group: asyncio.TaskGroup | None = None  # the session's, while it runs
        self._task: asyncio.Task[None] | None = None
        self._history: deque[tuple[str, str]] = deque(maxlen=HISTORY_TURNS)
        # The speculative reply held back: (segment, its user text, released when set).
        self._held: tuple[int, str, asyncio.Event] | None = None
        self._withdrawn = False  # the user went on after the pause of the held reply

    def cancel(self) -> bool:
        """Stop the reply in progress (its tts.end says interrupted); True if one ran."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            return True
        return False

    async def wait(self) -> None:
        """Until the reply in progress (if any) is over. The session calls it once every
        final is out: a reply still held back will be confirmed by none (its final was
        empty, or failed), so it is dropped unseen, not waited for."""
        held, self._held = self._held, None
        if held is not None and not held[2].is_set():
            self.cancel()
        if self._task is not None:
            await asyncio.wait([self._task])

    def release(self) -> None:
        """The session is over: drop what ties this to its listener and task group."""
        self.listener = None
        self.group = None
        self.emit_turn = None

    # -- tts mode -----------------------------------------------------------------------

    async def speak(self, sentences: AsyncIterator[str], reply: int) -> None:
        """Speak one utterance as reply `reply`, until it is spoken or cancelled."""
        assert self.group is not None
        task = self.group.create_task(self._speak(sentences, reply))
        self._task = task
        await asyncio.wait([task])

    async def _speak(self, sentences: AsyncIterator[str], reply: int) -> None:
        try:
            stats = await self.speaker.play(sentences, reply)
        except VoxError as exc:
            if exc.fatal:  # e.g. client_stalled: the session ends
                raise
            await self.outbox.event(exc.to_event(reply=reply))
            return
        if not stats.chunks and not stats.fallback:  # "....": no tts.start, say why
            empty = VoxError(ErrorCode.EMPTY_TEXT, "the text of this reply has nothing to speak")
            await self.outbox.event(empty.to_event(reply=reply))

    # -- assistant mode -------------------------------------------------------------------

    async def barge_in(self, segment: int) -> None:
        """The user started speaking (vad.start of `segment`). A held-back reply is left to
        its own turn's final (`start`), on its way: nobody saw it, so no barge-in for it."""
        held = self._held
        audible = self.speaker.audible()  # a reply (or the one before the held one) playing
        unseen = held is not None and not held[2].is_set()
        if (not unseen and self.cancel()) or audible:
            self.speaker.playback_until = 0.0
            await self.outbox.event(BargeIn(segment=segment))

    async def start(self, segment: int, text: str) -> None:
        """Answer the final transcript of `segment` (the previous reply is cancelled), or
        release its speculative reply if that answered the same text."""
        held, self._held = self._held, None
        withdrawn, self._withdrawn = self._withdrawn, False
        if held is not None and held[:2] == (segment, text):
            held[2].set()
            return
        if held is not None and not withdrawn:  # the final says otherwise: answered anew
            self.ctx.metrics.speculative_cancelled.inc()  # (withdrawn: counted at the resume)
        self.cancel()
        assert self.group is not None
        self._task = self.group.create_task(self._reply(segment, text), name="voxserve-reply")

    async def speculate(self, segment: int, text: str) -> None:
        """Answer `text` at a pause of `segment`, held back until `start` confirms it."""
        held = self._held
        if held is not None and held[:2] == (segment, text) and not held[2].is_set():
            self._withdrawn = False  # the same text after a resume: its reply goes on
            return
        self._withdrawn = False
        self.cancel()
        assert self.group is not None
        hold = asyncio.Event()
        self._held = (segment, text, hold)
        self._task = self.group.create_task(
            self._reply(segment, text, hold), name="voxserve-reply-speculative"
        )

    async def withdraw(self, segment: int) -> None:
        """The user went on after the pause: the held-back reply of `segment` is kept, idle
        and unseen, for the next pause or the final to take up or replace (module docstring)."""
        held = self._held
        if held is not None and held[0] == segment and not held[2].is_set():
            self._withdrawn = True

    async def _reply(self, segment: int, user_text: str, hold: asyncio.Event | None = None) -> None:
        responder = self.ctx.engines.responder
        listener = self.listener
        turn = listener.take_turn(segment) if listener and hold is None else None
        if listener is not None and listener.tracing and hold is not None:
            turn = TurnMarks(segment)  # its own marks, joined to its turn's once confirmed
        sentences = SpokenSentences()
        pieces: list[str] = []
        unsent: list[str] = []  # held back until `hold` is set

        def since() -> float | None:
            return listener.speech_ended_at(segment) if listener else None

        async def each(piece: str) -> None:
            pieces.append(piece)
            if hold is not None and (unsent or not hold.is_set()):
                unsent.append(piece)
            else:
                await self.outbox.event(ResponseDelta(reply=segment, text=piece))
            await sentences.push(piece)

        async def release() -> None:
            assert hold is not None
            await hold.wait()
            while unsent:
                await self.outbox.event(ResponseDelta(reply=segment, text=unsent.pop(0)))

        async def produce() -> None:
            await read_responder(
                partial(responder.respond, user_text, list(self._history)),
                each,
                limit=self.ctx.settings.pipeline.responder.timeout_s,
                metrics=self.ctx.metrics,
                turn=turn,
            )
            await sentences.end()

        failures: list[VoxError] = []
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(produce())
                if hold is not None:
                    group.create_task(release())
                await self.speaker.play(
                    sentences.read(), segment, since=since, turn=turn, hold=hold
                )
        except* VoxError as errors:
            failures = [exc for exc in errors.exceptions if isinstance(exc, VoxError)]
        finally:
            if hold is not None and turn is not None:  # speculative: its turn's, if confirmed
                whole = listener.take_turn(segment) if listener and hold.is_set() else None
                if whole is not None:
                    whole.marks.update(turn.marks)
                turn = whole
            if turn is not None and self.emit_turn is not None:
                self.emit_turn(turn)
        fatal = next((exc for exc in failures if exc.fatal), None)
        if fatal is not None:  # e.g. client_stalled: the session ends
            raise fatal
        if failures:
            if hold is not None:  # a speculative reply's failure is told once it is confirmed
                await hold.wait()
            for exc in failures:
                await self.outbox.event(exc.to_event(reply=segment))
            return
        reply_text = "".join(pieces).strip()
        await self.outbox.event(ResponseText(reply=segment, text=reply_text))
        self._history.append((user_text, reply_text))

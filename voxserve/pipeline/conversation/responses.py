"""The output side of a conversation session (the Realtime API): its responses, and its
user turns and the client's items as they reach the conversation (pipeline/conversation/items.py).
What one response does while it runs is pipeline/conversation/response_run.py's; this module decides
when responses run, one after another, and stops them.

A response is numbered by a per-session counter (1, 2, ...). It starts when a spoken turn's
final transcript comes (`turn_detection.create_response`) or on the client's request
(`create`), reads the conversation (pipeline/conversation/state.py), and sends, in this order:
ResponseStarted; for its text, ItemAdded (the assistant message, in progress), the
ResponseDelta pieces, the audio (TtsStart, PCM, TtsEnd; none when its modalities are text
only), ResponseText and ItemDone; each tool call's ItemAdded and FunctionCallDelta pieces
as they stream, then its FunctionCallDone and ItemDone; and ResponseDone, always last,
whatever happened: `completed`, `cancelled` (reason `turn_detected` on barge-in,
`client_cancelled` on the client's cancel) or `failed` (after the ErrorEvent that says why).

A cancelled or failed reply's assistant message is kept `incomplete`, its text cut to what
its audio had said when it stopped (speaker.spoken_text: the sentences sent whole, and the
words of the one cut in proportion to its audio sent; text-only replies keep what was
written). The responder's stream is closed and the synthesis withdrawn, as on barge-in in
/v1/stream. A reply that already sent its ResponseDone is not changed by a later barge-in:
as with OpenAI, the client truncates what it did not play (`truncate_item`). A cancelled or
failed reply sends no ResponseText; its ItemDone carries the text kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import msgspec

from voxserve.engines.base import ReplyRequest
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import (
    BargeIn,
    ConversationConfig,
    CreateItem,
    Item,
    ItemTruncated,
    ResponseOptions,
    ToolSpec,
    reply_item_id,
    speech_item_id,
)
from voxserve.observe.tracing import TurnMarks
from voxserve.pipeline.context import SessionContext
from voxserve.pipeline.conversation.items import ConversationItems
from voxserve.pipeline.conversation.response_run import ResponseRun, ToolBudget
from voxserve.pipeline.conversation.state import message_item
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.synthesis.speaker import ReplyStats, Speaker
from voxserve.pipeline.turns.listener import Listener

T = TypeVar("T")


class Responses:
    """A conversation session's responses and items (module docstring)."""

    def __init__(
        self,
        ctx: SessionContext,
        outbox: Outbox,
        speaker: Speaker,
        session_id: str,
        config: ConversationConfig,
        *,
        voice: str,
        sample_rate: int,
        emit_turn: Callable[[TurnMarks], None] | None = None,
    ) -> None:
        """`voice`, `sample_rate`: the session's (Session.update changes them, with
        `config`, for the responses that start after)."""
        self.ctx = ctx
        self.outbox = outbox
        self.speaker = speaker
        self.session_id = session_id
        self.config = config
        self.voice = voice
        self.sample_rate = sample_rate
        self.emit_turn = emit_turn
        self.items = ConversationItems(
            outbox, session_id, max_text_chars=ctx.settings.limits.max_text_chars
        )
        self.conversation = self.items.conversation
        self.listener: Listener | None = None  # its turns' marks and vad.end times
        self.group: asyncio.TaskGroup | None = None  # the session's, while it runs
        self._running: list[ResponseRun] = []  # started, ResponseDone not yet sent; oldest first
        self._replies = 0
        self._committed = -1  # the last spoken turn whose item was added
        # Push-to-talk: the client's last commit (its turn's segment once committed, None if
        # refused); a response.create after it waits for that turn's transcript.
        self._commit: asyncio.Future[int | None] | None = None
        self._asked: asyncio.Future[int | None] | None = None  # the commit a create follows
        self._transcribed = -1  # the last spoken turn whose final (or failure) is in
        self._transcripts: dict[int, asyncio.Future[None]] = {}  # turns a response awaits
        self._tools = self._new_turn()  # the tool calls the current user turn may make

    def _new_turn(self) -> ToolBudget:
        return ToolBudget(self.ctx.settings.realtime.max_tool_calls_per_turn)

    # -- lifetime -------------------------------------------------------------------------

    def active(self) -> bool:
        """A response runs that no cancel has reached (a new one would be refused)."""
        return any(r.cancel_reason is None and not r.finishing for r in self._running)

    def cancel(self, reason: str) -> bool:
        """Cancel every response running (ResponseDone `cancelled`, with `reason`); True if
        one was. Its model work stops: the responder's stream is closed, TTS withdrawn."""
        cancelled = False
        for response in self._running:
            if response.cancel_reason is not None or response.finishing:
                continue
            response.cancel_reason = reason
            cancelled = True
            if response.started and response.task is not None:
                response.task.cancel()  # else its coroutine sees the reason as it starts
        return cancelled

    async def wait(self) -> None:
        """Until every response is over (input has ended: a commit or transcript that has
        not come by now never will, and no response waits for it)."""
        if self._commit is not None and not self._commit.done():
            self._commit.set_result(None)
        self._transcribed_up_to(1 << 62)
        while tasks := [r.task for r in self._running if r.task and not r.task.done()]:
            await asyncio.wait(tasks)  # one may start another meanwhile (a queued turn)

    def release(self) -> None:
        """The session is over: drop what ties this to its listener and task group."""
        self.listener = None
        self.group = None
        self.emit_turn = None

    # -- the user's turns (the listener's hooks) ------------------------------------------

    async def speech_started(self, segment: int) -> None:
        """Barge-in (`turn_detection.interrupt_response`): the user speaks while a response
        runs or is still audible."""
        detection = self.config.turn_detection
        if detection is None or not detection.interrupt_response:
            return
        audible = self.speaker.audible()
        if self.cancel("turn_detected") or audible:
            self.speaker.playback_until = 0.0
            await self.outbox.event(BargeIn(segment=segment))

    async def user_committed(self, segment: int, audio_ms: int = 0) -> None:
        """A spoken turn ends (AudioCommitted is out): its user item, not yet transcribed;
        `audio_ms`: its speech (the response's usage counts it)."""
        self._committed = max(self._committed, segment)
        self._tools = self._new_turn()
        item_id = speech_item_id(self.session_id, segment)
        await self.items.add(message_item(item_id, "user", None, audio=True))
        self.items.heard(item_id, audio_ms)

    async def user_final(self, segment: int, text: str) -> None:
        """The turn's transcript (TranscriptFinal is out): the item is done; answer it when
        turn detection says so."""
        item = await self._user_item(segment)
        if item is None:
            self._transcribed_up_to(segment)
            return  # the client deleted it: nothing to complete or answer
        await self.items.done(msgspec.structs.replace(item, text=text))
        self._transcribed_up_to(segment)
        detection = self.config.turn_detection
        if not (self.config.responds and detection and detection.create_response and text):
            return
        asked = self._asked  # set before this final: turns/commits.commit resolves it first
        if asked is not None and asked.done() and asked.result() == segment:
            return  # the client's response.create answers this turn already
        if detection.interrupt_response:
            self.cancel("turn_detected")
        self._start(ResponseOptions(), segment)

    async def user_failed(self, segment: int, error: VoxError) -> None:
        """The turn's transcription failed (TranscriptFailed is out): the item is done with
        no text, and nothing answers it."""
        item = await self._user_item(segment)
        if item is not None:
            await self.items.done(item)
        self._transcribed_up_to(segment)

    def client_committed(self, turn: asyncio.Future[int | None]) -> None:
        """The client's `input_audio_buffer.commit` (Listener.commit's future): the next
        `response.create` answers its turn."""
        self._commit = turn

    def _transcribed_up_to(self, segment: int) -> None:
        """Turns up to `segment` have their final (finals come in order): wake who waits."""
        self._transcribed = max(self._transcribed, segment)
        for turn in [s for s in self._transcripts if s <= segment]:
            waiter = self._transcripts.pop(turn)
            if not waiter.done():
                waiter.set_result(None)

    async def _committed_turn(self, commit: asyncio.Future[int | None] | None) -> None:
        """Until the turn of the client's commit before a response.create is in the
        conversation with its transcript (at once when there was none, or it was refused):
        push-to-talk's `commit` then `response.create`, sent together, answer that turn,
        as OpenAI's do."""
        if commit is None:
            return
        segment = await asyncio.shield(commit)  # a cancel of the response is not the commit's
        if segment is None or segment <= self._transcribed:
            return
        waiter = self._transcripts.get(segment)
        if waiter is None:
            waiter = self._transcripts[segment] = asyncio.get_running_loop().create_future()
        await asyncio.shield(waiter)

    async def _user_item(self, segment: int) -> Item | None:
        item_id = speech_item_id(self.session_id, segment)
        item = self.conversation.get(item_id)
        if item is None and segment > self._committed:  # no commit hook came: add it now
            await self.user_committed(segment)
            item = self.conversation.get(item_id)
        return item

    # -- the client's items -------------------------------------------------------------

    async def create_item(self, message: CreateItem) -> None:
        await self.items.create(message)
        if message.kind == "message" and message.role == "user":
            self._tools = self._new_turn()

    async def delete_item(self, item_id: str) -> None:
        await self.items.delete(item_id)

    async def truncate_item(self, item_id: str, content_index: int, audio_end_ms: int) -> None:
        """ConversationItems.truncate; an item still being spoken is cut as it ends."""
        running = next((r for r in self._running if r.item_id == item_id and r.audio), None)
        playing = (running.stats, running.sample_rate) if running else None
        samples = self.items.truncate(item_id, content_index, audio_end_ms, playing)
        if running is not None:
            running.heard_samples = samples
        await self.outbox.event(
            ItemTruncated(item_id=item_id, content_index=content_index, audio_end_ms=audio_end_ms)
        )

    # -- responses ----------------------------------------------------------------------

    def create(self, options: ResponseOptions) -> None:
        """The client's `response.create`: refused while one runs (RESPONSE_ACTIVE), in a
        session that does not respond, or with a voice not served (UNKNOWN_VOICE)."""
        if not self.config.responds:
            raise VoxError(ErrorCode.WRONG_MODE, "a transcription session does not respond")
        if self.active():
            raise VoxError(
                ErrorCode.RESPONSE_ACTIVE,
                "a response is in progress: cancel it, or wait for its end",
            )
        self._asked = self._commit
        self._start(options, None, after=self._commit)

    def _start(
        self,
        options: ResponseOptions,
        segment: int | None,
        *,
        after: asyncio.Future[int | None] | None = None,
    ) -> None:
        """Start a response (after the ones running); `after`: the client's commit whose
        turn it answers (`_committed_turn`)."""
        defaults = self.config.response
        voice = options.voice or defaults.voice
        voice_id = self.ctx.engines.voice(voice)[0].id if voice else self.voice
        # Reported as the client named it (alloy), as the session reports it.
        named = options.voice_name if options.voice else defaults.voice_name
        modalities = options.output_modalities or defaults.output_modalities or ("audio",)
        self._replies += 1
        reply = self._replies
        response = ResponseRun(
            ctx=self.ctx,
            outbox=self.outbox,
            speaker=self.speaker,
            items=self.items,
            reply=reply,
            item_id=reply_item_id(self.session_id, reply),
            modalities=tuple(modalities),
            voice=voice_id,
            voice_name=named or voice_id,
            options=options,
            segment=segment,
            stats=ReplyStats(reply),
            tools=self._tools,
            sample_rate=self.sample_rate,
        )
        previous = [r.task for r in self._running if r.task is not None]
        self._running.append(response)
        assert self.group is not None
        response.task = self.group.create_task(
            self._run(response, previous, after), name="voxserve-response"
        )

    def _request(self, options: ResponseOptions) -> ReplyRequest:
        defaults = self.config.response
        tools: tuple[ToolSpec, ...] = (
            options.tools if options.tools is not None else defaults.tools or ()
        )
        return ReplyRequest(
            messages=self.items.view(),
            instructions=_first(options.instructions, defaults.instructions),
            tools=tools,
            tool_choice=_first(options.tool_choice, defaults.tool_choice),
            max_output_tokens=_first(options.max_output_tokens, defaults.max_output_tokens),
        )

    async def _run(
        self,
        response: ResponseRun,
        previous: list[asyncio.Task[None]],
        after: asyncio.Future[int | None] | None,
    ) -> None:
        """One response, start to ResponseDone (after the ones before it, and the turn of
        the commit it follows)."""
        response.started = True
        turn: TurnMarks | None = None
        error: VoxError | None = None
        try:
            if previous:
                await asyncio.wait(previous)  # their ResponseDone comes first
            await self._committed_turn(after)
            await response.announce()
            if response.cancel_reason is None:
                listener = self.listener
                segment = response.segment
                if segment is not None and listener is not None:
                    turn = listener.take_turn(segment)
                response.request = self._request(response.options)
                response.input_audio = self.items.audio_tokens()
                since = (
                    listener.speech_ended_at(segment) if listener and segment is not None else None
                )
                error = await response.work(turn, since)
        except asyncio.CancelledError:
            if response.cancel_reason is None:
                raise  # the session ends
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # ours: the response ends as cancelled
        finally:
            if turn is not None and self.emit_turn is not None:
                self.emit_turn(turn)
        output = await response.end_items(error)
        self._running.remove(response)
        await response.done(error, output)


def _first(value: T | None, default: T | None) -> T | None:
    return value if value is not None else default

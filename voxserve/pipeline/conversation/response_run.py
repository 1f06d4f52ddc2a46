"""One response of a conversation session as it runs: from its ResponseStarted, through its
responder's stream (text pieces to the assistant item and to the speaker, tool-call pieces
to their own items), to its items' ItemDone and its ResponseDone.

Apart from pipeline/conversation/responses.py, which decides when responses run (their numbers, what
starts one, cancel and barge-in, one after another) and feeds the user's and the client's
items: this module is what a single response does once it runs, and what it leaves behind
when it ends (see responses.py for the events' order and what a cancel keeps).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import msgspec

from voxserve.engines.base import Conversant, ReplyRequest, ReplyUsage, ToolCallDelta
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import (
    UNSET,
    FunctionCallDelta,
    FunctionCallDone,
    Item,
    ResponseDelta,
    ResponseDone,
    ResponseOptions,
    ResponseStarted,
    ResponseText,
    Usage,
)
from voxserve.observe.tracing import TurnMarks
from voxserve.pipeline.context import SessionContext
from voxserve.pipeline.conversation.items import ConversationItems
from voxserve.pipeline.conversation.state import message_item, simple_turns
from voxserve.pipeline.conversation.usage import usage_of
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.streams import SpokenSentences, read_responder
from voxserve.pipeline.synthesis.speaker import ReplyStats, Speaker, spoken_text


@dataclass
class ToolCall:
    """A tool call's item while its arguments stream."""

    item: Item
    arguments: list[str] = field(default_factory=list)


@dataclass
class ToolBudget:
    """The tool calls a user turn may make (`realtime.max_tool_calls_per_turn`), over the
    responses that follow the user's message: one more fails the response with
    TOO_MANY_TOOL_CALLS, so a responder that calls tools again and again cannot loop."""

    limit: int
    used: int = 0

    def take(self) -> None:
        if self.used >= self.limit:
            raise VoxError(
                ErrorCode.TOO_MANY_TOOL_CALLS,
                f"the responder made more than {self.limit} tool calls since the user's last"
                " message (realtime.max_tool_calls_per_turn)",
                stage="responder",
            )
        self.used += 1


@dataclass
class ResponseRun:
    """One response while it runs (module docstring). Responses owns its task and sets
    `cancel_reason`; the rest is this response's own."""

    ctx: SessionContext
    outbox: Outbox
    speaker: Speaker
    items: ConversationItems
    reply: int
    item_id: str
    modalities: tuple[str, ...]
    voice: str
    voice_name: str  # as the client named it (reported back)
    options: ResponseOptions
    segment: int | None  # the spoken turn it answers, if any (latency, tracing)
    stats: ReplyStats
    tools: ToolBudget  # its turn's, shared with the responses before and after it
    sample_rate: int  # of its audio (a session.update meanwhile changes the next one's)
    request: ReplyRequest | None = None  # built from the conversation when it starts
    task: asyncio.Task[None] | None = None
    started: bool = False  # its coroutine runs: a cancel interrupts it
    announced: bool = False  # ResponseStarted is out
    cancel_reason: str | None = None
    finishing: bool = False  # its last events are going out: too late to cancel
    item: Item | None = None  # the assistant message, once it has text
    pieces: list[str] = field(default_factory=list)
    calls: dict[int, ToolCall] = field(default_factory=dict)
    heard_samples: int | None = None  # a client's truncation while it ran
    input_audio: int = 0  # tokens of the conversation's audio items it read (usage.py)
    reported: ReplyUsage | None = None  # its responder's count, if it gave one

    @property
    def audio(self) -> bool:
        """It speaks (its modalities include audio), else text only."""
        return "audio" in self.modalities

    @property
    def in_conversation(self) -> bool:
        return self.options.in_conversation

    async def announce(self) -> None:
        """ResponseStarted, once. Marked sent only once it is in the outbox: a cancel that
        lands while it waits for room (a slow reader) leaves it for end_items to send."""
        if not self.announced:
            await self.outbox.event(
                ResponseStarted(
                    reply=self.reply,
                    item_id=self.item_id,
                    output_modalities=self.modalities,
                    voice=self.voice,
                    in_conversation=self.in_conversation,
                    voice_name=self.voice_name,
                    metadata=self.options.metadata,
                )
            )
            self.announced = True

    async def _whole(self, send: Coroutine[Any, Any, object]) -> None:
        """Send what `send` sends whole, even when the client's cancel (or a barge-in) lands
        while it waits for room in the outbox (a slow reader): the cancel is taken once it
        is out. Else the client could get an item's ItemDone and never its ItemAdded. The
        session's end is not held up: then the send is dropped with the rest."""
        sending = asyncio.ensure_future(send)
        try:
            await asyncio.shield(sending)
        except asyncio.CancelledError:
            try:
                if self.cancel_reason is not None:  # ours: taken once the send is out
                    await asyncio.shield(sending)
            finally:
                if not sending.done():  # the session ends: dropped with the rest
                    sending.cancel()
                    await asyncio.wait([sending])
            raise

    async def work(self, turn: TurnMarks | None, since: float | None) -> VoxError | None:
        """Stream the responder's reply (and speak it, `since` the end of the turn's speech);
        a non-fatal failure is returned, a fatal one raised."""
        failures: list[VoxError] = []
        try:
            if not self.audio:
                await self._produce(None, turn)
            else:
                sentences = SpokenSentences()
                self.speaker.configure(voice=self.voice, sample_rate=self.sample_rate)
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._produce(sentences, turn))
                    await self.speaker.play(
                        sentences.read(), self.reply, since=since, turn=turn, stats=self.stats
                    )
        except* VoxError as errors:
            failures = [exc for exc in errors.exceptions if isinstance(exc, VoxError)]
        fatal = next((exc for exc in failures if exc.fatal), None)
        if fatal is not None:  # e.g. client_stalled: the session ends
            raise fatal
        return failures[0] if failures else None

    async def _produce(self, sentences: SpokenSentences | None, turn: TurnMarks | None) -> None:
        """The responder's stream: text to the client (and to `sentences` to speak), tool
        calls to their items."""
        request = self.request
        assert request is not None
        responder = self.ctx.engines.responder

        async def each(piece: str | ToolCallDelta | ReplyUsage) -> None:
            if isinstance(piece, ToolCallDelta):
                await self._call_piece(piece)
            elif isinstance(piece, ReplyUsage):
                self.reported = piece
            elif piece:
                await self._text_piece(piece)
                if sentences is not None:
                    await sentences.push(piece)

        if isinstance(responder, Conversant):
            await read_responder(
                partial(responder.converse, request),
                each,
                limit=self.ctx.settings.pipeline.responder.timeout_s,
                metrics=self.ctx.metrics,
                turn=turn,
            )
        else:  # rules, echo: the last user text and the turns before it; no tools
            await read_responder(
                partial(responder.respond, *simple_turns(request.messages)),
                each,
                limit=self.ctx.settings.pipeline.responder.timeout_s,
                metrics=self.ctx.metrics,
                turn=turn,
            )
        if sentences is not None:
            await sentences.end()

    async def _text_piece(self, piece: str) -> None:
        if self.cancel_reason is not None:
            return  # cancelled, the cancellation not yet delivered: nothing more goes out
        if self.item is None:  # its first text: the assistant message begins
            item = message_item(
                self.item_id, "assistant", "", audio=self.audio, status="in_progress"
            )
            self.item = item
            await self._whole(self.items.add(item, in_conversation=self.in_conversation))
        self.pieces.append(piece)
        delta = ResponseDelta(reply=self.reply, text=piece)
        if not self.outbox.event_nowait(delta):  # the common case: room, no task
            await self._whole(self.outbox.event(delta))

    async def _call_piece(self, piece: ToolCallDelta) -> None:
        if self.cancel_reason is not None:
            return
        call = self.calls.get(piece.index)
        if call is None:
            self.tools.take()
            item_id, call_id = self.items.new_call(piece.call_id)
            item = Item(
                id=item_id,
                kind="function_call",
                status="in_progress",
                call_id=call_id,
                name=piece.name or "",
                arguments="",
            )
            call = self.calls[piece.index] = ToolCall(item)
            await self._whole(self.items.add(item, in_conversation=self.in_conversation))
        elif piece.name and not call.item.name:
            call.item = msgspec.structs.replace(call.item, name=piece.name)
        if piece.arguments:
            call.arguments.append(piece.arguments)
            delta = FunctionCallDelta(
                reply=self.reply,
                item_id=call.item.id,
                call_id=str(call.item.call_id),
                name=str(call.item.name),
                delta=piece.arguments,
            )
            if not self.outbox.event_nowait(delta):
                await self._whole(self.outbox.event(delta))

    def status(self, error: VoxError | None) -> str:
        return "failed" if error else "cancelled" if self.cancel_reason else "completed"

    async def end_items(self, error: VoxError | None) -> list[Item]:
        """Its last events before ResponseDone (framed by a ResponseStarted even when
        cancelled before it began): the error, then its items done. Returns them."""
        self.finishing = True
        await self.announce()
        status = self.status(error)
        if error is not None:
            await self.outbox.event(error.to_event(reply=self.reply))
        done = "completed" if status == "completed" else "incomplete"
        output: list[Item] = []
        item = self.item
        if item is not None:
            text = "".join(self.pieces).strip()
            stats = self.stats
            if status == "completed":
                await self.outbox.event(ResponseText(reply=self.reply, text=text))
            elif self.audio:
                text = spoken_text(stats.sentences, stats.samples)
            if self.audio and self.heard_samples is not None:
                text = spoken_text(stats.sentences, min(stats.samples, self.heard_samples))
            output.append(
                await self.items.done(msgspec.structs.replace(item, status=done, text=text))
            )
            if self.audio and self.in_conversation:
                self.items.spoke(item.id, (stats, self.sample_rate), self.heard_samples)
        for call in self.calls.values():
            arguments = "".join(call.arguments)
            if status == "completed":
                await self.outbox.event(
                    FunctionCallDone(
                        reply=self.reply,
                        item_id=call.item.id,
                        call_id=str(call.item.call_id),
                        name=str(call.item.name),
                        arguments=arguments,
                    )
                )
            finished = msgspec.structs.replace(call.item, status=done, arguments=arguments)
            output.append(await self.items.done(finished))
        return output

    async def done(self, error: VoxError | None, output: list[Item]) -> None:
        """ResponseDone: always its last event."""
        status = self.status(error)
        reason = self.cancel_reason if status == "cancelled" else None
        await self.outbox.event(
            ResponseDone(
                reply=self.reply,
                status=status,
                reason=UNSET if reason is None else reason,
                code=error.code.value if error else UNSET,
                message=error.message if error else UNSET,
                output=tuple(output),
                usage=self.usage(),
            )
        )

    def usage(self) -> Usage:
        """Its tokens (pipeline/conversation/usage.py)."""
        written = len("".join(self.pieces))
        written += sum(len(part) for call in self.calls.values() for part in call.arguments)
        audio_ms = self.stats.samples * 1000 // self.sample_rate if self.audio else 0
        return usage_of(
            self.request,
            self.reported,
            input_audio=self.input_audio,
            output_chars=written,
            output_audio_ms=audio_ms,
        )

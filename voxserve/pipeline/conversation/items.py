"""A conversation session's items as the client sees them change: each change to the
conversation (pipeline/conversation/state.py) with the event that tells the client, and the
client's own changes (create, delete, truncate), checked first so that a refused one
changes nothing.

Truncation needs what an assistant item's audio said when: the reply's sentences and the
samples sent (speaker.ReplyStats), kept for the newest KEPT_AUDIO spoken items.

Every function call the responder makes gets the session's own call id (`call_<item id>`),
never the model's: some LLM servers reuse a call id, and a conversation keyed by a reused
id would pair the second call with the first one's output. The model's own id is kept
beside it (`_upstream`) and is what the model reads back (`view`): an id it chose, in the
form its server accepts (Mistral's take 9 characters).
"""

from __future__ import annotations

from collections import OrderedDict

import msgspec

from voxserve.engines.base import ChatMessage
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.events import CreateItem, Item, ItemAdded, ItemDeleted, ItemDone
from voxserve.pipeline.conversation.state import VIEW_CHARS, Conversation, message_item
from voxserve.pipeline.conversation.usage import audio_tokens
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.synthesis.speaker import ReplyStats, spoken_text

KEPT_AUDIO = 16  # assistant items whose audio timing is kept for truncation (the newest)
ROLES = ("user", "assistant", "system")

Spoken = tuple[ReplyStats, int]  # a reply's audio: its stats and its sample rate


class ConversationItems:
    """The conversation, and the events of its changes (module docstring)."""

    def __init__(self, outbox: Outbox, session_id: str, *, max_text_chars: int) -> None:
        self.outbox = outbox
        self.session_id = session_id
        self.max_text_chars = max_text_chars
        self.conversation = Conversation()
        self._ids = 0  # items the session names (function calls, the client's unnamed items)
        self._audio: OrderedDict[str, Spoken] = OrderedDict()
        self._upstream: dict[str, str] = {}  # the session's call id -> the model's
        self._heard: dict[str, int] = {}  # audio items' ms (turns, replies): usage.py

    def new_call(self, upstream: str | None) -> tuple[str, str]:
        """A function call of the responder's: its item id and the session's call id for it,
        mapped to the model's `upstream` one (module docstring)."""
        item_id = self.new_id("f")
        call_id = f"call_{item_id}"
        if upstream:
            self._upstream[call_id] = upstream
        return item_id, call_id

    def heard(self, item_id: str, audio_ms: int) -> None:
        """An audio item's length (a user's turn, a reply's audio as heard)."""
        if self.conversation.get(item_id) is not None:
            self._heard[item_id] = audio_ms

    def audio_tokens(self) -> int:
        """The tokens of the conversation's audio items (usage.audio_tokens)."""
        return sum(
            audio_tokens(self._heard[item.id], _text(item.role))
            for item in self.conversation
            if item.id in self._heard
        )

    def view(self) -> tuple[ChatMessage, ...]:
        """The conversation as the responder reads it, its calls under the model's ids."""
        return self.conversation.view(self._upstream)

    def new_id(self, kind: str) -> str:
        self._ids += 1
        return f"item_{self.session_id}{kind}{self._ids}"

    async def add(
        self, item: Item, previous_item_id: str | None = None, *, in_conversation: bool = True
    ) -> str | None:
        """ItemAdded (and ItemDeleted for the oldest items it pushed out); returns the id it
        follows. Out of the conversation (an out-of-band response's items): announced, not
        kept."""
        if not in_conversation:
            await self.outbox.event(ItemAdded(item=item, previous_item_id=None))
            return None
        previous, removed = self.conversation.add(item, previous_item_id)
        await self.outbox.event(ItemAdded(item=item, previous_item_id=previous))
        for item_id in removed:
            self._audio.pop(item_id, None)
            self._upstream.pop(f"call_{item_id}", None)
            self._heard.pop(item_id, None)
            await self.outbox.event(ItemDeleted(item_id=item_id))
        return previous

    async def done(self, item: Item) -> Item:
        """ItemDone for `item` as it ends (kept in the conversation if it is still there)."""
        previous = None
        if self.conversation.replace(item):
            previous = self.conversation.previous_id(item.id)
        await self.outbox.event(ItemDone(item=item, previous_item_id=previous))
        return item

    def spoke(self, item_id: str, spoken: Spoken, heard: int | None = None) -> None:
        """An assistant item's audio ended: keep its timing for a later truncation; `heard`:
        the samples the client played, if it truncated the item while it ran."""
        self._audio[item_id] = spoken
        stats, rate = spoken
        samples = stats.samples if heard is None else min(heard, stats.samples)
        self.heard(item_id, samples * 1000 // rate)
        while len(self._audio) > KEPT_AUDIO:
            self._audio.popitem(last=False)

    # -- the client's changes -------------------------------------------------------------

    async def create(self, message: CreateItem) -> None:
        """ItemAdded + ItemDone, or a VoxError (INVALID_PARAMETER, TEXT_TOO_LONG) with no
        change. A function_call_output need not match a call in the conversation (as with
        OpenAI); one that does not is shown to the responder as a system note."""
        item = self._client_item(message)
        previous = await self.add(item, message.previous_item_id)
        await self.outbox.event(ItemDone(item=item, previous_item_id=previous))

    def _client_item(self, message: CreateItem) -> Item:
        if message.kind == "message":
            if message.role not in ROLES:
                raise VoxError(ErrorCode.INVALID_PARAMETER, "a message item needs a role")
            _check_length("text", message.text, self.max_text_chars)
        elif message.kind == "function_call":
            if not message.name:
                raise VoxError(ErrorCode.INVALID_PARAMETER, "a function_call item needs a name")
            _check_length("arguments", message.arguments, VIEW_CHARS)
        else:
            if not message.call_id:
                raise VoxError(
                    ErrorCode.INVALID_PARAMETER, "a function_call_output item needs a call_id"
                )
            _check_length("output", message.output, VIEW_CHARS)
        if message.item_id and message.item_id.startswith(f"item_{self.session_id}"):
            raise VoxError(
                ErrorCode.INVALID_PARAMETER,
                f"item ids beginning item_{self.session_id} are the session's own",
            )
        item_id = message.item_id or self.new_id("c")
        if message.kind == "message":
            assert message.role is not None
            return message_item(item_id, message.role, message.text)
        call_id = message.call_id or f"call_{item_id}"
        if message.kind == "function_call":
            return Item(
                id=item_id,
                kind="function_call",
                call_id=call_id,
                name=message.name or "",
                arguments=message.arguments,
            )
        return Item(id=item_id, kind="function_call_output", call_id=call_id, output=message.output)

    async def delete(self, item_id: str) -> None:
        self.conversation.delete(item_id)
        self._audio.pop(item_id, None)
        self._upstream.pop(f"call_{item_id}", None)
        self._heard.pop(item_id, None)
        await self.outbox.event(ItemDeleted(item_id=item_id))

    def truncate(
        self, item_id: str, content_index: int, audio_end_ms: int, playing: Spoken | None
    ) -> int:
        """The client played an assistant item's audio only up to `audio_end_ms`: its text
        is cut to what that audio said (speaker.spoken_text); returns the samples heard.
        `playing`: the audio of the item's response while it still runs (the caller cuts
        its text as it ends). Refused: not an assistant audio item the session spoke, a
        content index other than 0, a time past the audio sent."""
        item = self.conversation.get(item_id)
        if item is None:
            raise VoxError(
                ErrorCode.INVALID_PARAMETER, f"no item {quoted(item_id)} in the conversation"
            )
        spoken = playing or self._audio.get(item_id)
        if spoken is None or item.role != "assistant" or not item.audio:
            raise VoxError(
                ErrorCode.INVALID_PARAMETER,
                f"item {quoted(item_id)} is not an assistant audio item spoken in this session",
            )
        if content_index != 0:
            raise VoxError(ErrorCode.INVALID_PARAMETER, "an audio item has one content part: 0")
        stats, rate = spoken
        samples = audio_end_ms * rate // 1000
        if audio_end_ms < 0 or samples > stats.samples:
            sent_ms = stats.samples * 1000 // rate
            raise VoxError(
                ErrorCode.INVALID_PARAMETER,
                f"audio_end_ms {audio_end_ms} is past the item's audio ({sent_ms} ms)",
            )
        if playing is None:
            text = spoken_text(stats.sentences, samples)
            self.conversation.replace(msgspec.structs.replace(item, text=text))
        self._heard[item_id] = audio_end_ms  # its audio past that is gone from the context
        return samples


def _check_length(what: str, text: str, limit: int) -> None:
    if len(text) > limit:
        raise VoxError(ErrorCode.TEXT_TOO_LONG, f"the item's {what} is over {limit} characters")


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""

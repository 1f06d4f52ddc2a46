"""The items of a conversation session (the Realtime API's conversation), in order, and the
view of them a responder reads.

Items are user messages (spoken turns, whose text comes with their final transcript, or
text), assistant messages (replies), system messages, function calls and their outputs.
Every change is the caller's to announce (pipeline/conversation/responses.py sends the events); this
module only keeps them and refuses, with a VoxError the client reads, what cannot be done:
an id already present, an unknown item or previous item.

Bounds, so a long session cannot grow without end:
- at most `max_items` items (MAX_ITEMS): adding one more removes the oldest, and `add`
  returns their ids so that the client is told (`ItemDeleted` for each, as for its own
  delete);
- a responder reads only the newest items whose text, arguments and outputs add up to
  `view_chars` (VIEW_CHARS, about 6k tokens); the older ones stay in the conversation,
  for the client, but leave the responder's view.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace

from voxserve.engines.base import ChatMessage, ToolCall
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.events import Item

MAX_ITEMS = 256  # items kept; the oldest are deleted (and the client told) beyond it
VIEW_CHARS = 24_000  # characters of the newest items a responder reads
ROOT = "root"  # previous_item_id that inserts at the beginning (as the Realtime API)


def _size(item: Item) -> int:
    return sum(len(part) for part in (item.text, item.arguments, item.output) if part)


def _text(value: str | object) -> str:
    return value if isinstance(value, str) else ""


class Conversation:
    """One session's items (module docstring). Small: a list, searched by id."""

    def __init__(self, *, max_items: int = MAX_ITEMS, view_chars: int = VIEW_CHARS) -> None:
        self.max_items = max(1, max_items)
        self.view_chars = view_chars
        self._items: list[Item] = []

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self._items)

    def last_id(self) -> str | None:
        """The id of the newest item (what an item added at the end follows)."""
        return self._items[-1].id if self._items else None

    def get(self, item_id: str) -> Item | None:
        return next((item for item in self._items if item.id == item_id), None)

    def _index(self, item_id: str) -> int:
        for index, item in enumerate(self._items):
            if item.id == item_id:
                return index
        raise VoxError(
            ErrorCode.INVALID_PARAMETER, f"no item {quoted(item_id)} in the conversation"
        )

    def add(self, item: Item, previous_item_id: str | None = None) -> tuple[str | None, list[str]]:
        """Insert `item` after `previous_item_id` (None: at the end; "root": first).
        Returns the id it follows and the ids of the oldest items removed to stay within
        `max_items` (never the new one)."""
        if self.get(item.id) is not None:
            raise VoxError(
                ErrorCode.INVALID_PARAMETER,
                f"item id {quoted(item.id)} is already in the conversation",
            )
        if previous_item_id is None:
            position = len(self._items)
        elif previous_item_id == ROOT:
            position = 0
        else:
            position = self._index(previous_item_id) + 1
        self._items.insert(position, item)
        previous = self._items[position - 1].id if position else None
        removed: list[str] = []
        while len(self._items) > self.max_items:
            oldest = self._items[0] if self._items[0] is not item else self._items[1]
            self._items.remove(oldest)
            removed.append(oldest.id)
        return previous, removed

    def previous_id(self, item_id: str) -> str | None:
        index = self._index(item_id)
        return self._items[index - 1].id if index else None

    def replace(self, item: Item) -> bool:
        """Put `item` in place of the item with its id; False if that one is gone
        (deleted by the client meanwhile)."""
        for index, old in enumerate(self._items):
            if old.id == item.id:
                self._items[index] = item
                return True
        return False

    def delete(self, item_id: str) -> Item:
        return self._items.pop(self._index(item_id))

    # -- what a responder reads -----------------------------------------------------------

    def view(self, upstream: Mapping[str, str] | None = None) -> tuple[ChatMessage, ...]:
        """The newest items within `view_chars`, as chat messages (`_messages`); `upstream`:
        call ids to show as the model's own (items.ConversationItems)."""
        chosen: list[Item] = []
        budget = self.view_chars
        for item in reversed(self._items):
            if item.text is None and item.kind == "message":
                continue  # a spoken turn not transcribed (yet, or it failed): nothing to read
            budget -= _size(item)
            if budget < 0 and chosen:
                break
            chosen.append(item)
        chosen.reverse()
        messages = tuple(_messages(chosen))
        return _renamed(messages, upstream) if upstream else messages


def _messages(items: list[Item]) -> Iterator[ChatMessage]:
    """Items as a chat model reads them. A function call is shown only with its output,
    right after the assistant message that made it (strict chat APIs refuse a call with no
    answer, or an answer not next to its call); an output whose call is not in view (the
    client's own, or one whose call left the view) is shown as a system note."""
    outputs = {_text(item.call_id): item for item in items if item.kind == "function_call_output"}
    shown: set[str] = set()
    pending: ChatMessage | None = None  # the assistant message the next calls join
    for item in items:
        if item.kind == "function_call":
            call_id = _text(item.call_id)
            if call_id not in outputs or call_id in shown:
                continue
            call = ToolCall(call_id, _text(item.name), _text(item.arguments))
            if pending is None:
                pending = ChatMessage("assistant", tool_calls=(call,))
            else:
                pending = ChatMessage(
                    "assistant", pending.content, tool_calls=(*pending.tool_calls, call)
                )
            shown.add(call_id)
            continue
        if pending is not None and pending.tool_calls:
            yield from _answered(pending, outputs)
            pending = None
        if item.kind == "function_call_output":
            if _text(item.call_id) not in shown:
                yield ChatMessage(
                    "system",
                    f"Output of tool call {_text(item.call_id)}: {_text(item.output)}",
                )
            continue
        if pending is not None:
            yield pending
            pending = None
        role = _text(item.role)
        message = ChatMessage(
            "assistant" if role == "assistant" else "system" if role == "system" else "user",
            item.text or "",
        )
        if message.role == "assistant":
            pending = message  # calls that follow join it
        else:
            yield message
    if pending is not None:
        if pending.tool_calls:
            yield from _answered(pending, outputs)
        else:
            yield pending


def _renamed(
    messages: tuple[ChatMessage, ...], upstream: Mapping[str, str]
) -> tuple[ChatMessage, ...]:
    """`messages` with each call id the session gave shown as the model's own."""

    def renamed(message: ChatMessage) -> ChatMessage:
        if message.tool_calls:
            calls = tuple(
                replace(call, call_id=upstream.get(call.call_id, call.call_id))
                for call in message.tool_calls
            )
            return replace(message, tool_calls=calls)
        if message.call_id is not None:
            return replace(message, call_id=upstream.get(message.call_id, message.call_id))
        return message

    return tuple(renamed(message) for message in messages)


def _answered(message: ChatMessage, outputs: dict[str, Item]) -> Iterator[ChatMessage]:
    yield message
    for call in message.tool_calls:
        yield ChatMessage("tool", _text(outputs[call.call_id].output), call_id=call.call_id)


def simple_turns(messages: tuple[ChatMessage, ...]) -> tuple[str, list[tuple[str, str]]]:
    """For a responder without `converse` (rules, echo): the last user text, and the
    (user, assistant) turns before it."""
    last = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last is None:
        return "", []
    turns: list[tuple[str, str]] = []
    user: str | None = None
    for message in messages[:last]:
        if message.role == "user":
            user = message.content
        elif message.role == "assistant" and user is not None and message.content:
            turns.append((user, message.content))
            user = None
    return messages[last].content, turns


def message_item(
    item_id: str, role: str, text: str | None, *, audio: bool = False, status: str = "completed"
) -> Item:
    """A message item (a turn, a reply, a client's text)."""
    return Item(id=item_id, kind="message", role=role, status=status, audio=audio, text=text)

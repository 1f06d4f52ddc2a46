"""The parts of server/realtime/stream.py that need no socket: which client event an error
answers, and the key a browser offers as a subprotocol."""

from __future__ import annotations

import asyncio

from voxserve.errors import ErrorCode, VoxError
from voxserve.events import ErrorEvent, VadStart
from voxserve.pipeline.outbox import Outbox
from voxserve.server.realtime.stream import key_subprotocol
from voxserve.server.realtime_api.origins import ErrorOrigins


def error(**where: int) -> ErrorEvent:
    return VoxError(ErrorCode.INVALID_MESSAGE, "bad").to_event(**where)  # type: ignore[arg-type]


async def test_an_error_queued_while_a_message_is_handled_answers_that_message() -> None:
    outbox = Outbox(16)
    origins = ErrorOrigins(outbox)
    sent: list[tuple[ErrorEvent | VadStart, str | None]] = []

    def take(event: ErrorEvent | VadStart) -> None:
        origins.taken += 1
        sent.append((event, origins.origin(event) if isinstance(event, ErrorEvent) else None))

    await outbox.event(VadStart(segment=1, start_ms=0))  # the pipeline's, before any message
    origins.begin()  # message "a": nothing to report
    origins.end("a")
    origins.begin()  # message "b": one error
    await outbox.event(error())
    origins.end("b")
    origins.begin()  # message "c": refused, while the pipeline reports its own error
    await outbox.event(error(segment=2))
    await outbox.event(error())
    origins.end("c")
    origins.begin()  # message without an event_id
    await outbox.event(error())
    origins.end(None)
    while outbox.qsize():
        item = await outbox.next()
        assert isinstance(item, ErrorEvent | VadStart)
        take(item)
    assert [origin for _, origin in sent] == [None, "b", None, "c", None]


async def test_an_event_whose_put_was_cancelled_does_not_shift_the_numbering() -> None:
    """A put cancelled while it waits for room (a barge-in stops a reply whose tts.start
    waits behind a slow reader) queues nothing and so numbers nothing: the next message's
    error still answers that message."""
    outbox = Outbox(1)
    origins = ErrorOrigins(outbox)
    await outbox.event(VadStart(segment=1, start_ms=0))  # the outbox is full
    waiting = asyncio.create_task(outbox.event(VadStart(segment=2, start_ms=0)))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    origins.taken += 1
    assert isinstance(await outbox.next(), VadStart)  # the first one, taken by the sender
    origins.begin()  # message "a": refused
    await outbox.event(error())
    origins.end("a")
    item = await outbox.next()
    assert isinstance(item, ErrorEvent) and outbox.qsize() == 0
    origins.taken += 1
    assert origins.origin(item) == "a"


def test_the_key_of_the_browser_subprotocol() -> None:
    assert key_subprotocol(["realtime", "openai-insecure-api-key.sk-1"]) == "sk-1"
    assert key_subprotocol(["realtime"]) is None
    assert key_subprotocol(["openai-insecure-api-key."]) is None

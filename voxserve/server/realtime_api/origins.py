"""Which client event an `error` event answers, for its `error.event_id` (the Realtime
API's tie between a refused client event and its error), on /v1/realtime
(server/realtime/stream.py) and a WebRTC call's data channel (server/webrtc/link.py). The
codec ties its own refusals (realtime_api/codec.py); these are the rest the receiver
reports: what the session refuses, the audio quota."""

from __future__ import annotations

import json
from collections import deque

from voxserve.events import ErrorEvent, ServerEvent
from voxserve.pipeline.outbox import Outbox


class ErrorOrigins:
    """Which client event an `error` answers, so it can carry that event's `event_id`.

    The receiver handles one message at a time: what it reports for a message (a decode
    error, a refused update, the audio quota) is queued between that message's decode and
    the next receive. The outbox numbers its events (`Outbox.sent_events`), so each
    message's window of numbers is kept here, and the sender, counting the events it takes,
    looks an error's number up. Errors of the pipeline itself (they name a segment or a
    reply) answer no client event."""

    KEPT = 64  # windows of recent messages that queued anything; older ones are sent

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
        self._windows: deque[tuple[int, int, str]] = deque(maxlen=self.KEPT)
        self._start: int | None = None
        self.taken = 0  # events the sender took from the outbox

    def begin(self) -> None:
        self._start = self._outbox.sent_events

    def end(self, event_id: str | None) -> None:
        start, self._start = self._start, None
        end = self._outbox.sent_events
        if start is not None and event_id and end > start:
            self._windows.append((start, end, event_id))

    def origin(self, event: ErrorEvent) -> str | None:
        """The event_id of the client event `event` answers (called once per event taken)."""
        number = self.taken
        if isinstance(event.segment, int) or isinstance(event.reply, int):
            return None
        windows = self._windows
        while windows and windows[0][1] < number:
            windows.popleft()
        if windows and windows[0][0] < number <= windows[0][1]:
            return windows[0][2]
        return None

    def tie(self, event: ServerEvent, texts: list[str]) -> list[str]:
        """`texts`, the encoding of the next event the sender took from the outbox, with an
        `error`'s event_id where it answers a client event. Counts the event: called once
        for each event taken (reply audio is not an event)."""
        self.taken += 1
        if isinstance(event, ErrorEvent) and (event_id := self.origin(event)):
            return [with_event_id(text, event_id) for text in texts]
        return texts


def with_event_id(text: str, event_id: str) -> str:
    """An encoded `error` event with the client event it answers (`error.event_id`)."""
    value = json.loads(text)
    error = value.get("error")
    if isinstance(error, dict) and error.get("event_id") is None:
        error["event_id"] = event_id
        return json.dumps(value)
    return text

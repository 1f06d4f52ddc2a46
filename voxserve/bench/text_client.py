"""The tts stream: send a sentence, time its audio, and wait until a real-time player would
have played it (plus a pause) before the next, so each stream is one listener's worth of
load. first_audio runs from sending the text to the first audio byte."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

from websockets.asyncio.client import ClientConnection

from voxserve.bench.records import Raw
from voxserve.bench.replies import ReplyAudio
from voxserve.bench.wsbase import WsStream


class TextStream(WsStream):
    def __init__(
        self,
        url: str,
        start: dict[str, Any],
        raw: Raw,
        *,
        texts: Sequence[str],
        first_text: int,
        end_at: float,
        drain_s: float,
        pause_s: float = 0.3,
        reply_timeout_s: float = 30.0,
        deflate: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            url, start, raw, end_at=end_at, drain_s=drain_s, deflate=deflate, headers=headers
        )
        self.texts = texts
        self.next_text = first_text
        self.pause_s = pause_s
        self.reply_timeout_s = reply_timeout_s
        self.sent: dict[int, float] = {}
        self.done = asyncio.Event()
        self.replies = ReplyAudio(raw, self._first_audio)

    async def produce(self, ws: ClientConnection) -> None:
        reply = 0
        while time.monotonic() < self.end_at:
            text = self.texts[self.next_text % len(self.texts)]
            self.next_text += 1
            self.done.clear()
            self.sent[reply] = time.monotonic()
            await ws.send(json.dumps({"type": "text", "text": text, "flush": True}))
            self.raw.counts["texts_sent"] += 1
            try:
                async with asyncio.timeout(self.reply_timeout_s):
                    await self.done.wait()
            except TimeoutError:
                self.error("reply_timeout")
                return
            reply += 1
            wait = max(self.replies.playback_end, time.monotonic()) + self.pause_s
            await asyncio.sleep(max(0.0, min(wait, self.end_at) - time.monotonic()))

    def on_audio(self, size: int, now: float) -> None:
        self.replies.chunk(size, now)

    def on_event(self, kind: object, event: dict[str, Any], now: float) -> None:
        if kind == "tts.start":
            self.replies.start(event)
        elif kind == "tts.end":
            self.replies.end(event)
            self.done.set()
        elif kind == "error" and "reply" in event:
            self.done.set()  # the reply failed (counted by code); go on with the next

    def _first_audio(self, reply: int, now: float) -> None:
        sent = self.sent.get(reply)
        if sent is not None:
            self.raw.add("first_audio", now - sent)

"""What every WebSocket load stream shares: errors recorded by code instead of raised
(`RecordedStream`, the /v1/stream clients' and the Realtime client's), frames paced by the
wall clock (`paced`); and for /v1/stream (`WsStream`): connect, `session.start`, a receiver
task, the end of input, a bounded drain.

Subclasses send (`produce`) and interpret server events (`on_event`, `on_audio`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from array import array
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from voxserve.bench.records import Raw
from voxserve.bench.schedule import FrameClock


async def paced(clock: FrameClock, k: int, lateness: array[float]) -> float:
    """Wait until frame k is due; its lateness (how long after that this is) is recorded.
    Returns the time it is sent at."""
    due = clock.due(k)
    delay = due - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    now = time.monotonic()
    lateness.append(now - due)
    return now


class RecordedStream:
    """One session whose `run()` never raises: every failure ends up in `raw.errors` by
    code. Subclasses write the session (`_run`), what a close by the server means
    (`_closed`) and what is left to count at the end (`finish`)."""

    def __init__(self, raw: Raw) -> None:
        self.raw = raw
        self.failed = False

    def error(self, code: str) -> None:
        self.raw.errors[code] += 1
        self.failed = True

    async def run(self) -> None:
        try:
            await self._run()
        except InvalidStatus as exc:  # refused at the handshake (auth, overload)
            self._refused(exc)
        except (OSError, InvalidHandshake, InvalidURI) as exc:
            self.error(f"connect:{type(exc).__name__}")
        except ConnectionClosed as exc:
            self._closed(exc)
        except TimeoutError:
            self.error("timeout")
        if self.failed:
            self.raw.failed_streams += 1
        self.finish()

    async def _run(self) -> None:
        raise NotImplementedError

    def _refused(self, exc: InvalidStatus) -> None:
        self.error(f"connect:{type(exc).__name__}")

    def _closed(self, exc: ConnectionClosed) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Turn what was seen into samples once the session is over."""


class WsStream(RecordedStream):
    """One /v1/stream session (module docstring)."""

    def __init__(
        self,
        url: str,
        start: dict[str, Any],
        raw: Raw,
        *,
        end_at: float,
        drain_s: float,
        deflate: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(raw)
        self.url = url
        self.headers = headers
        self.start = {"type": "session.start", **start}
        self.end_at = end_at
        self.drain_s = drain_s
        self.deflate = deflate
        self.ended = asyncio.Event()

    async def _run(self) -> None:
        began = time.monotonic()
        compression = "deflate" if self.deflate else None
        async with connect(
            self.url,
            additional_headers=self.headers,
            compression=compression,
            open_timeout=10,
            ping_interval=None,
            max_size=None,
        ) as ws:
            # A server at capacity refuses before reading anything: its error is then
            # already on the way and the start may find the socket closing.
            with contextlib.suppress(ConnectionClosed):
                await ws.send(json.dumps(self.start))
            async with asyncio.timeout(10):
                first = json.loads(await ws.recv())
            if first.get("type") != "session.started":
                self.raw.add("refusal", time.monotonic() - began)
                self.raw.counts["refused"] += 1
                self.error(str(first.get("code", first.get("type", "refused"))))
                return
            self.raw.add("connect", time.monotonic() - began)
            self.raw.counts["sessions"] += 1
            receiver = asyncio.create_task(self._receive(ws))
            try:
                await self.produce(ws)
                await ws.send(json.dumps({"type": "audio.end"}))
                done, _ = await asyncio.wait({receiver}, timeout=self.drain_s)
                if not done:
                    self.error("drain_timeout")
                elif not self.ended.is_set() and not self.failed:
                    self.error("no_session_ended")
            finally:
                receiver.cancel()
                await asyncio.gather(receiver, return_exceptions=True)
            if receiver.done() and not receiver.cancelled() and receiver.exception():
                exc = receiver.exception()
                if isinstance(exc, ConnectionClosed):
                    self._closed(exc)

    def _closed(self, exc: ConnectionClosed) -> None:
        code = exc.rcvd.code if exc.rcvd is not None else 1006
        if code != 1000 or not self.ended.is_set():
            self.error(f"close_{code}")

    async def _receive(self, ws: ClientConnection) -> None:
        async for message in ws:
            now = time.monotonic()
            if isinstance(message, bytes):
                self.on_audio(len(message), now)
                continue
            event = json.loads(message)
            kind = event.get("type")
            if kind == "error":
                self.raw.errors[str(event.get("code"))] += 1
                self.failed = self.failed or bool(event.get("fatal"))
            if kind == "session.ended":
                self.ended.set()
                for key in ("received", "processed", "dropped", "duplicates", "segments"):
                    value = event.get(key)
                    if isinstance(value, int):
                        self.raw.counts[f"server_{key}"] += value
                return
            self.on_event(kind, event, now)

    async def produce(self, ws: ClientConnection) -> None:
        raise NotImplementedError

    def on_event(self, kind: object, event: dict[str, Any], now: float) -> None:
        """A JSON event other than session.ended (errors are counted before this)."""

    def on_audio(self, size: int, now: float) -> None:
        """A binary message (reply audio)."""

"""A WebRTC call's link to its session: the `oai-events` data channel and the two audio tracks
in place of /v1/realtime's WebSocket (server/realtime/stream.py's `RealtimeLink`).

The way in (session_input.ClientInput) is one bounded inbox fed by the data channel's
messages (Realtime client events, decoded by the same RealtimeDecoder) and by a task reading
the caller's audio (20 ms PCM16 frames at 16 kHz, numbered here): the driver's receiver
takes both, so quotas, the idle clock and the counters apply as on every wire. A flood of
messages is dropped past the bound and told with one `error`; an oversized one is never
kept. The way out drains the outbox: events become Realtime server events on the channel
(the encoder makes no `response.output_audio.delta` on media "track"), reply audio goes to
the outgoing track. What the track does is told as OpenAI's WebRTC tells it:
`output_audio_buffer.started` / `.stopped`, and `.cleared` when the audio is cut, by a
barge-in (the assistant item is then truncated at what the caller heard) or by the client's
`output_audio_buffer.clear`. The channel's SCTP buffer is bounded: a caller that reads
nothing for `limits.stalled_client_s` ends the session as `client_stalled`.

The call (server/webrtc/calls.py) owns the peer connection and the driver: it starts the
driver, makes the link once the channel is open (with the messages that came before, as
`pending`: the link listens from then on), runs `run()`, calls `hang_up()` when the peer is
gone, then closes the driver and the peer connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from voxserve.errors import ErrorCode, VoxError
from voxserve.events import (
    BargeIn,
    ResponseStarted,
    SessionEnded,
    TruncateItem,
    TtsEnd,
    TtsStart,
)
from voxserve.pipeline.outbox import Outgoing
from voxserve.runtime import Runtime
from voxserve.server.realtime_api.codec import RealtimeDecoder
from voxserve.server.realtime_api.events import RealtimeEncoder
from voxserve.server.realtime_api.origins import ErrorOrigins
from voxserve.server.realtime_api.responses import request_limits
from voxserve.server.realtime_api.session import RealtimeWire
from voxserve.server.session.attachment import serve_attached
from voxserve.server.session.driver import SessionDriver
from voxserve.server.session.events import internal_error
from voxserve.server.session.input import ClientInput, Decoded, Frames, InputEnd, Wire
from voxserve.server.session.quotas import quotas_of

log = logging.getLogger(__name__)

WEBRTC = Wire("webrtc", in_band_end=True, stalls=False, tasks="voxserve-webrtc")
LABEL = "oai-events"  # the data channel OpenAI's WebRTC clients open
MAX_QUEUED_MESSAGES = 64  # data channel messages waiting for the session; past it: dropped
MAX_QUEUED_FRAMES = 50  # 1 s of the caller's audio waiting; past it the reader waits
MAX_FRAMES_A_MESSAGE = 10  # frames queued together are handed on as one message
BUFFER_HIGH = 256 * 1024  # SCTP bytes queued on the channel past which the sender waits
BUFFER_LOW = 64 * 1024  # ... until they are down to this
MAX_TRACK_EVENTS = 32  # track events waiting behind the sender (bounded: never more)
MAX_REPLIES = 16  # replies whose response and item ids are kept for the track's events
FLUSH_S = 1.0  # how long the session's last events get to leave before run returns
SEQ_MOD = 1 << 32


class DataChannel(Protocol):
    """What the link uses of aiortc's RTCDataChannel."""

    @property
    def readyState(self) -> str: ...

    @property
    def bufferedAmount(self) -> int: ...

    bufferedAmountLowThreshold: int

    def send(self, data: str | bytes) -> None: ...

    def on(self, event: str, f: Callable[..., Any]) -> Any: ...

    def remove_listener(self, event: str, f: Callable[..., Any]) -> Any: ...


class Inbound(Protocol):
    """The caller's audio (server/webrtc/inbound.py's InboundAudio)."""

    async def read(self) -> bytes | None: ...

    @property
    def packets_lost(self) -> int: ...

    @property
    def concealed_ms(self) -> int: ...


class Outbound(Protocol):
    """The reply's track (server/webrtc/outbound.py's OutboundTrack)."""

    on_started: Callable[[int], None] | None
    on_stopped: Callable[[int], None] | None

    def write(self, pcm: bytes, reply: int) -> None: ...

    def finish(self, reply: int) -> None: ...

    def clear(self) -> int: ...

    def played_ms(self, reply: int) -> int: ...


def with_media(ended: SessionEnded, inbound: Inbound | None) -> SessionEnded:
    """`ended` with the call's media counters (the caller's audio lost on the network and
    the milliseconds filled in), as `voxserve.session.ended` reports them on a call."""
    if inbound is None:
        return ended
    return msgspec.structs.replace(
        ended, packets_lost=inbound.packets_lost, concealed_ms=inbound.concealed_ms
    )


@dataclass(frozen=True, slots=True)
class TooLarge:
    """A data channel message over limits.max_message_bytes (not kept: only its size)."""

    size: int


class Dropped:
    """Stands for the messages dropped while the inbox was full (told once per run)."""


NOTHING: Frames = []  # what a message that changes nothing in the session decodes to
Incoming = str | bytes | Frames | TruncateItem | TooLarge | Dropped


class Inbox:
    """The way in, in arrival order: data channel messages (bounded: past the bound they
    are dropped and one `Dropped` stands for them), the caller's audio frames (bounded: the
    reader waits), the link's own truncation, and the end."""

    def __init__(self, max_message_bytes: int) -> None:
        self.max_message_bytes = max_message_bytes
        self._items: deque[Incoming | tuple[int, memoryview] | InputEnd] = deque()
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.messages = 0
        self.frames = 0
        self.dropped = 0  # since the last Dropped was read
        self.ended = False

    def message(self, data: str | bytes) -> None:
        """A data channel message (the channel's callback: never waits)."""
        if self.ended:
            return
        size = len(data)
        if isinstance(data, str) and size * 4 > self.max_message_bytes:
            size = len(data.encode("utf-8", "surrogatepass"))
        if self.messages >= MAX_QUEUED_MESSAGES:
            self.drop(1)
            return
        self.messages += 1
        self._push(TooLarge(size) if size > self.max_message_bytes else data)

    def drop(self, count: int) -> None:
        """`count` messages dropped (here, or by the call before the link): one `Dropped`
        tells them all, so a flood is never dropped unsaid."""
        if count <= 0 or self.ended:
            return
        if not self.dropped:
            self._push(Dropped())
        self.dropped += count

    def internal(self, message: TruncateItem) -> None:
        """The link's own message (one per cut reply: bounded by the replies)."""
        if not self.ended:
            self._push(message)

    async def frame(self, seq: int, pcm: bytes) -> None:
        while self.frames >= MAX_QUEUED_FRAMES and not self.ended:
            self._room.clear()
            await self._room.wait()
        if not self.ended:
            self.frames += 1
            self._push((seq, memoryview(pcm)))

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self._push(InputEnd.GONE)
            self._room.set()

    def _push(self, item: Incoming | tuple[int, memoryview] | InputEnd) -> None:
        self._items.append(item)
        self._ready.set()

    async def get(self) -> Incoming | InputEnd:
        items = self._items
        while not items:
            self._ready.clear()
            await self._ready.wait()
        item = items.popleft()
        if isinstance(item, tuple):
            frames = [item]
            while items and len(frames) < MAX_FRAMES_A_MESSAGE and isinstance(items[0], tuple):
                frame = items.popleft()
                assert isinstance(frame, tuple)
                frames.append(frame)
            self.frames -= len(frames)
            self._room.set()
            return frames
        if isinstance(item, str | bytes | TooLarge):
            self.messages -= 1
        return item

    def take_dropped(self) -> int:
        dropped, self.dropped = self.dropped, 0
        return dropped


@dataclass(frozen=True, slots=True)
class _Reply:
    response_id: str | None
    item_id: str
    truncatable: bool  # an audio item of the conversation (truncate_item takes it)


class WebRtcLink:
    """One call serving its session (module docstring). `wire`: the call's RealtimeWire
    (media "track"); `inbound`: None when the caller sends no audio."""

    def __init__(
        self,
        driver: SessionDriver,
        wire: RealtimeWire,
        channel: DataChannel,
        inbound: Inbound | None,
        outbound: Outbound,
        runtime: Runtime,
        *,
        pending: Sequence[str | bytes] = (),
        dropped: int = 0,
    ) -> None:
        if wire.media != "track":
            raise ValueError("a WebRTC call's wire has media 'track'")
        self.driver = driver
        self.session = driver.session
        self.channel = channel
        self.inbound = inbound
        self.outbound = outbound
        self.runtime = runtime
        self.limits = limits = runtime.settings.limits
        self.opened_at = time.monotonic()
        quotas, principal = quotas_of(runtime), driver.slot.quota.principal
        self.encoder = RealtimeEncoder(wire, lambda: request_limits(quotas, principal))
        self.decoder = RealtimeDecoder(
            wire, limits.max_message_bytes, limits.max_json_depth, output_clear=self._output_clear
        )
        self.origins = ErrorOrigins(self.session.outbox)
        self.inbox = Inbox(limits.max_message_bytes)
        self._seq = 0
        self._replies: dict[int, _Reply] = {}
        self._writing: int | None = None  # the reply whose audio goes on the track now
        self._on_track: int | None = None  # the reply audible on the track (till stopped, cut)
        self._last_audio: int | None = None  # the last reply that had audio on the track
        self._written: set[int] = set()  # replies with audio written and not yet finished
        self._held: deque[str] = deque()  # track events waiting while the sender is busy
        self._busy = True  # the sender holds an item not yet sent (or has not begun)
        self._changed = asyncio.Event()  # the channel opened, drained, or closed
        self._listeners: list[tuple[str, Callable[..., Any]]] = []
        # The way in from now on: a client may send as the channel opens (OpenAI's browser
        # sample sends session.update in `onopen`); `pending`: what came before the link,
        # `dropped`: how many more the call could not hold (told as this link's own).
        for data in pending:
            self.inbox.message(data)
        self.inbox.drop(dropped)
        for event, listener in (
            ("message", self.received),
            ("open", self._changed.set),
            ("bufferedamountlow", self._changed.set),
            ("close", self.hang_up),
        ):
            channel.on(event, listener)
            self._listeners.append((event, listener))

    # -- the call ---------------------------------------------------------------------------

    async def run(self) -> None:
        """session.created first, then serve the session until it ends or the call does."""
        driver, channel, outbound = self.driver, self.channel, self.outbound
        driver.announce()
        channel.bufferedAmountLowThreshold = BUFFER_LOW
        outbound.on_started, outbound.on_stopped = self._started, self._stopped
        reader = None
        if self.inbound is not None:
            reader = asyncio.get_running_loop().create_task(
                self._read_audio(self.inbound), name=f"{WEBRTC.tasks}-audio"
            )
        try:
            if await self._opened() and self._write(
                self.encoder.encode(self.session.started_event())
            ):
                source: ClientInput[Incoming] = self
                await serve_attached(driver, source, self._send(), since=self.opened_at)
        finally:
            if reader is not None:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            for event, listener in self._listeners:
                channel.remove_listener(event, listener)
            outbound.on_started = outbound.on_stopped = None
            self._count_media()
        if self.session.outbox.stalled:
            driver.end_stalled()

    def received(self, data: str | bytes) -> None:
        """A data channel message (the channel's "message" listener): queued, never waits."""
        self.inbox.message(data)

    def hang_up(self) -> None:
        """The peer is gone (or the data channel closed): the input ends (InputEnd.GONE),
        and run returns. Idempotent."""
        self.inbox.end()
        self._changed.set()

    def say_ended(self) -> None:
        """Tell the session's end on the channel (`voxserve.session.ended` with the media
        counters) when the call, not the session, ended it (a hang-up, no media): the
        sender has stopped by then. Best effort: the caller may be leaving."""
        if self.channel.readyState != "open":
            return
        with contextlib.suppress(TypeError, ValueError):
            self._write(self.encoder.encode(with_media(self.session.ended_event(), self.inbound)))

    def _count_media(self) -> None:
        inbound = self.inbound
        if inbound is None:
            return
        metrics = self.runtime.metrics
        metrics.webrtc_packets_lost.inc(inbound.packets_lost)
        metrics.webrtc_concealed.inc(inbound.concealed_ms / 1000)

    # -- the way in (session_input.ClientInput) ---------------------------------------------

    async def receive(self) -> Incoming | InputEnd:
        self.origins.end(self.decoder.last_event_id)  # the last message's reports are queued
        return await self.inbox.get()

    def decode(self, message: Incoming) -> Decoded:
        self.origins.begin()
        if isinstance(message, str):
            return self.decoder.decode(message)
        self.decoder.last_event_id = None
        if isinstance(message, list | TruncateItem):
            return message  # the caller's audio; the link's own truncation (a barge-in)
        if isinstance(message, TooLarge):
            raise VoxError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"a data channel message of {message.size} bytes is over "
                f"{self.limits.max_message_bytes}",
            )
        if isinstance(message, Dropped):
            raise VoxError(
                ErrorCode.OVERLOADED,
                f"{self.inbox.take_dropped()} data channel messages were dropped: more than "
                f"{MAX_QUEUED_MESSAGES} waited for the session",
            )
        raise VoxError(
            ErrorCode.INVALID_MESSAGE,
            "binary messages are not part of the Realtime API: send client events as text",
        )

    def release(self) -> None:
        """Nothing is held back: each frame is queued as it comes."""

    async def _read_audio(self, inbound: Inbound) -> None:
        """The caller's audio into the inbox, numbered. InboundAudio's runs on a clock and
        never ends (silence once the caller's track ended: the VAD hears the turn end); an
        Inbound that does end (None) just stops: its end is not the call's."""
        try:
            while (pcm := await inbound.read()) is not None:
                await self.inbox.frame(self._seq, pcm)
                self._seq = (self._seq + 1) % SEQ_MOD
        except Exception:
            log.warning("the caller's audio could not be read", exc_info=True)

    def _output_clear(self) -> Decoded:
        """`output_audio_buffer.clear`: the track cut now, `output_audio_buffer.cleared`,
        and the item truncated at what the caller heard (the session answers with
        conversation.item.truncated)."""
        cut = self._cut(always=True)
        return NOTHING if cut is None else cut

    # -- the track ----------------------------------------------------------------------------

    def _cut(self, *, always: bool) -> TruncateItem | None:
        """Stop the reply audible on the track: what is buffered is dropped, the rest of
        its audio too; `output_audio_buffer.cleared` (`always`: even with nothing audible,
        as the answer to the client's clear). The truncation, when the item takes one."""
        reply = self._on_track
        self._writing = None
        if reply is None:
            if always:
                self._track_event("output_audio_buffer.cleared", self._last_audio)
            return None
        played = self.outbound.played_ms(reply)
        self.outbound.clear()
        self._on_track = None
        self._written.discard(reply)
        self._track_event("output_audio_buffer.cleared", reply)
        known = self._replies.get(reply)
        if known is None or not known.truncatable:
            return None
        return TruncateItem(known.item_id, 0, played)

    def _started(self, reply: int) -> None:
        self._track_event("output_audio_buffer.started", reply)

    def _stopped(self, reply: int) -> None:
        if self._on_track == reply:
            self._on_track = None
        self._track_event("output_audio_buffer.stopped", reply)

    def _track_event(self, kind: str, reply: int | None) -> None:
        """An event of the track, after what the sender is sending now (in order)."""
        known = None if reply is None else self._replies.get(reply)
        text = self.encoder.extra(kind, response_id=known.response_id if known else None)
        if self._busy or self.channel.bufferedAmount > BUFFER_HIGH:
            if len(self._held) < MAX_TRACK_EVENTS:
                self._held.append(text)
            else:  # the caller reads nothing: the stall ends the session
                log.warning("track event dropped: the data channel is full")
            return
        self._write([text])

    # -- the way out --------------------------------------------------------------------------

    async def _opened(self) -> bool:
        """Until the data channel is open (the call waits for it; this is the guard)."""
        while True:
            state = self.channel.readyState
            if state == "open":
                return True
            if state in ("closing", "closed") or self.inbox.ended:
                return False
            self._changed.clear()
            await self._changed.wait()

    def _write(self, texts: list[str]) -> bool:
        """Texts onto the channel (aiortc queues them: never waits); False once it is not open."""
        if self.channel.readyState != "open":
            return False
        try:
            for text in texts:
                self.channel.send(text)
        except Exception:  # aiortc's InvalidStateError: closed meanwhile
            return False
        return True

    async def _room(self) -> bool:
        """Until the channel's buffer is under BUFFER_HIGH; False if the channel closed or
        the caller read nothing for limits.stalled_client_s (the session ends stalled)."""
        channel = self.channel
        if channel.bufferedAmount <= BUFFER_HIGH:
            return channel.readyState == "open"
        deadline = time.monotonic() + self.limits.stalled_client_s
        while channel.bufferedAmount > BUFFER_LOW:
            if channel.readyState != "open" or self.inbox.ended:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                self.driver.client_stalled()
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._changed.wait()
        return True

    def _take(self, item: Outgoing) -> list[str]:
        """The texts for one outbox item; what the item means for the track is `_after`'s."""
        if isinstance(item, bytes):
            return self.encoder.encode_audio(item)  # its message announced, if not yet
        if isinstance(item, SessionEnded):
            item = with_media(item, self.inbound)
        texts = self.origins.tie(item, self.encoder.encode(item))
        if isinstance(item, ResponseStarted):
            self._replies[item.reply] = _Reply(
                self.encoder.responses.response_id(item.reply),
                item.item_id,
                item.in_conversation and "audio" in item.output_modalities,
            )
            while len(self._replies) > MAX_REPLIES:
                self._replies.pop(next(iter(self._replies)))
        return texts

    def _after(self, item: Outgoing) -> None:
        """The track's part of an item, once its events are out."""
        if isinstance(item, bytes):
            reply = self._writing
            if reply is not None:  # else: audio of a reply cut (or of none): dropped
                self.outbound.write(item, reply)
                self._on_track = self._last_audio = reply
                self._written.add(reply)
        elif isinstance(item, TtsStart):
            self._writing = item.reply
        elif isinstance(item, TtsEnd):
            if self._writing == item.reply:
                self._writing = None
            if item.reply in self._written:
                self._written.discard(item.reply)
                self.outbound.finish(item.reply)
        elif isinstance(item, BargeIn):
            truncation = self._cut(always=False)
            if truncation is not None:
                self.inbox.internal(truncation)  # applied by the receiver, in order

    async def _send(self) -> None:
        """Drain the outbox onto the channel and the track, until the session is over."""
        driver, outbox = self.driver, self.session.outbox
        while True:
            if self._held:
                self._write(list(self._held))
                self._held.clear()
            self._busy = False
            item = await outbox.next()
            self._busy = True
            if item is None:
                break
            driver.unsent = item  # the driver's rule; a call's session is never resumed
            try:
                texts = self._take(item)
            except (TypeError, ValueError):
                self._unsendable()
                return
            for text in texts:
                if not await self._room() or not self._write([text]):
                    return
            self._after(item)
            driver.unsent = None
        await self._flush()

    async def _flush(self) -> None:
        """The session's last events get FLUSH_S to leave before the call closes."""
        deadline = time.monotonic() + FLUSH_S
        channel = self.channel
        while channel.bufferedAmount and channel.readyState == "open":
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.02)

    def _unsendable(self) -> None:
        """An event the codec cannot encode (a bug): `internal` and the end, at once."""
        log.error("event could not be encoded; session ended")
        goodbye = self.driver.end_now(internal_error())
        with contextlib.suppress(TypeError, ValueError):
            self._write([text for event in goodbye for text in self.encoder.encode(event)])

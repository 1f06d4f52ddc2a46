"""One Wyoming connection (Home Assistant's voice protocol): ASR, TTS and `describe`.

ASR: `transcribe` (optional: model name, language), `audio-start`, `audio-chunk`s,
`audio-stop` -> `transcript-start`, `transcript-chunk`s while the audio comes, then
`transcript` and `transcript-stop` (Wyoming >= 1.7 streaming; wyoming/stt.py runs the
request as a live session). Audio at a rate a session does not take is recognised whole
at `audio-stop` (as an upload is) and answered by `transcript` alone.

TTS: `synthesize` -> `audio-start`, `audio-chunk`s, `audio-stop`; streaming
`synthesize-start`, `synthesize-chunk`s, `synthesize-stop` speaks each sentence as soon as
it is complete, in one audio-start/stop, then `synthesize-stopped` (the `synthesize` that
Home Assistant also sends while streaming, for older servers, is ignored).

Errors are `error` events whose `code` is the voxserve code (docs/protocol.md); the
connection stays open. A transcription that fails (an error from its audio-start to its
audio-stop: refused, over quota, bad audio, the engine) is also ended: the `error`, then an
empty `transcript` (and `transcript-stop` if `transcript-start` was out). Home Assistant's
speech-to-text skips `error` and reads until `transcript` or the connection closes; without
the transcript it waited `limits.idle_timeout_s` to fail. The error comes first, so a client
that reads to `transcript` has read the error too. The rest of that request's audio, to its
audio-stop, is dropped without a second error. TTS and `detect` errors are the `error`
alone. An error after `audio-start` (an engine failing mid-reply) comes after that reply's
`audio-stop`, so every reply begun is ended. Each request counts against
`limits.max_sessions` while it runs.

Events are read by `wyoming_protocol` (lengths capped, fields checked) instead of the
package's trusting reader; broken framing ends the connection after an `error`. A
connection silent for `limits.idle_timeout_s` (`idle_timeout`) or open for
`limits.max_session_s` (`session_expired`, checked between events) is closed after its
`error`. Wyoming carries no key: the caller is `anonymous` for quotas (`quotas.anonymous`),
each request is a session of it, and its audio is charged per chunk (over quota the
request ends with `quota_exceeded`). Wyoming has its own share of the server
(wyoming/seats.py): a connection over its caps gets `wyoming_limit` and is closed before
any event is read; a request over its share of sessions is refused with `wyoming_limit`.

Audio formats are checked once per request (wyoming_recording's `check_format`) before any
audio is taken, and every chunk against them; work on audio that is more than a copy
(resampling: the decode pool; the wake model: the executor) runs off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioFormat, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler

from voxserve.errors import ErrorCode, VoxError
from voxserve.observe.logs import bind_session
from voxserve.pipeline.recognition.bulk import transcribe
from voxserve.runtime import Runtime
from voxserve.server.session.auth import ANONYMOUS
from voxserve.server.session.events import limit_error
from voxserve.server.session.loop_share import turn_ends
from voxserve.server.session.quotas import quotas_of
from voxserve.server.wyoming.info import server_info
from voxserve.server.wyoming.protocol import check_event, read_event
from voxserve.server.wyoming.recording import (
    AUDIO_EVENTS,
    Recording,
    at_16k,
    check_format,
    seconds_of,
)
from voxserve.server.wyoming.seats import WyomingSlot, open_wyoming, seats_of
from voxserve.server.wyoming.stt import StreamedTranscription, end_transcript, streams
from voxserve.server.wyoming.tts import WyomingSpeech
from voxserve.server.wyoming.wake import WyomingWake, drop
from voxserve.types import SAMPLE_RATE

log = logging.getLogger(__name__)

TRANSPORT = "wyoming"
# After the server ends a connection, what the peer still sends is read and dropped for at
# most this long (its FIN sent first), so the peer reads the last event (`lingering_close`).
LINGER_S = 1.0
REFUSALS = frozenset(
    {ErrorCode.OVERLOADED, ErrorCode.NOT_READY, ErrorCode.QUOTA_EXCEEDED, ErrorCode.WYOMING_LIMIT}
)


class WyomingHandler(AsyncEventHandler):
    """Events of one connection, handled in order; state lives for one request."""

    def __init__(
        self, runtime: Runtime, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        super().__init__(reader, writer)
        self.runtime = runtime
        self.trace_id = uuid.uuid4().hex[:16]
        self._language: str | None = None
        self._recording: Recording | None = None
        self._asr: WyomingSlot | None = None  # a whole-recognition request's slot
        self._stream: StreamedTranscription | None = None  # a streamed request's session
        self._speech = WyomingSpeech(runtime, self.write_event)
        self._wake = WyomingWake(runtime, self.write_event)  # `detect` flow (wyoming/wake.py)
        self._audio_open = False  # an audio-start was sent and its audio-stop not yet
        self._failed = False  # a transcription ended by its error; its audio-stop not yet in
        bind_session(self.trace_id)

    async def run(self) -> None:
        """Read events until the peer leaves, the framing breaks, or a limit ends the
        connection (the package's loop, with voxserve's reader and limits)."""
        self._is_running = True
        limits = self.runtime.settings.limits
        cap = limits.max_message_bytes
        expires_at = time.monotonic() + limits.max_session_s
        seats, peer = seats_of(self.runtime), self._peer()
        try:
            seats.connect(peer)
        except VoxError as exc:  # over Wyoming's connection caps: said, then closed
            await self._error(exc)
            await lingering_close(self.reader, self.writer)
            return
        turn_over = turn_ends()
        try:
            while self._is_running:
                if time.perf_counter() >= turn_over:
                    # Buffered events are read without a pause: a write of tens of
                    # thousands of tiny ones would hold the loop (server/session/loop_share.py).
                    await asyncio.sleep(0)
                    turn_over = turn_ends()
                left = expires_at - time.monotonic()
                if left <= 0:
                    await self._error(self._limit_error(expired=True))
                    return
                try:
                    async with asyncio.timeout(min(limits.idle_timeout_s, left)):
                        event = await read_event(
                            self.reader,
                            max_data=cap,
                            max_payload=cap,
                            max_depth=limits.max_json_depth,
                        )
                except TimeoutError:
                    # Which bound ran out, not a clock read after it: loop timers may fire
                    # a clock tick early.
                    await self._error(self._limit_error(expired=left <= limits.idle_timeout_s))
                    return
                except VoxError as exc:  # the stream cannot be read past a broken event
                    await self._error(exc)
                    return
                if event is None or not await self.handle_event(event):
                    return
        except ConnectionError:  # the peer left while it was answered: nobody to tell
            log.debug("wyoming client gone")  # said once, by the session (attachment.py)
        finally:
            seats.disconnect(peer)
            await self.disconnect()
            await lingering_close(self.reader, self.writer)

    def _peer(self) -> str:
        """The client's address (its port left out): what the per-peer cap counts."""
        name = self.writer.get_extra_info("peername")
        if isinstance(name, tuple) and name:
            return str(name[0])
        return str(name or "")

    def _limit_error(self, *, expired: bool) -> VoxError:
        limits = self.runtime.settings.limits
        return limit_error(
            limits, expired=expired, fatal=False, unit="connections", message="event"
        )

    async def handle_event(self, event: Event) -> bool:
        routed = self._wake.route(event.type)
        handler = routed or self._handlers().get(event.type)
        if handler is None:
            return True  # Wyoming peers drop events they do not know
        if routed is drop:  # a refused detection's audio (wyoming_wake `route`)
            return True
        if event.type == "detect":
            self._failed = False  # the audio that follows is the detection's
        elif routed is None and self._failed and event.type in ("audio-chunk", "audio-stop"):
            self._failed = event.type == "audio-chunk"  # a failed request's audio: dropped
            return True
        try:
            check_event(event)
            await handler(event)
            return True
        except VoxError as exc:
            error = exc
        except Exception as exc:
            if isinstance(exc, ConnectionError) and self.writer.is_closing():
                raise  # the peer is gone (run): no error to write
            log.exception("wyoming event failed", extra={"event": event.type})
            error = VoxError(ErrorCode.INTERNAL, "internal error; see server logs")
        transcription = routed is None and event.type in AUDIO_EVENTS
        if transcription:  # its audio up to audio-stop is dropped (module docstring)
            self._failed = event.type != "audio-stop"
        elif routed is not None:  # a detection's: the same (wyoming_wake `refuse`)
            self._wake.refuse(event.type)
        await self._error(error, transcription=transcription)
        return True

    def _handlers(self) -> dict[str, Callable[[Event], Awaitable[None]]]:
        return {
            "describe": self._describe,
            "ping": self._ping,
            "transcribe": self._transcribe,
            "audio-start": self._audio_start,
            "audio-chunk": self._audio_chunk,
            "audio-stop": self._audio_stop,
            "synthesize": self._speech.synthesize,
            "synthesize-start": self._speech.synthesize_start,
            "synthesize-chunk": self._speech.synthesize_chunk,
            "synthesize-stop": self._speech.synthesize_stop,
            "detect": self._wake.detect,
        }

    async def write_event(self, event: Event) -> None:
        """Every event out; tracks whether a reply's audio is open (audio-start written,
        its audio-stop not yet), so that an error mid-reply ends it first (`_error`)."""
        if event.type == "audio-start":
            self._audio_open = True
        elif event.type == "audio-stop":
            self._audio_open = False
        await super().write_event(event)

    async def disconnect(self) -> None:
        self._end_asr()
        self._speech.end()
        self._wake.end()

    async def _error(self, error: VoxError, *, transcription: bool = False) -> None:
        """The error event; `transcription`: it ended a transcription, which then gets its
        closing events too (module docstring) and drops its audio up to its audio-stop."""
        self.runtime.metrics.errors.labels(error.code.value, TRANSPORT).inc()
        if error.code in REFUSALS:
            self.runtime.metrics.refused.labels(error.code.value).inc()
        stream = self._stream
        started = stream is not None and stream.started
        if stream is not None and stream.done:
            transcription = False  # the stream already wrote its end (wyoming_stt)
        # A failed request is over: its slot is free and its state forgotten.
        self._end_asr()
        self._speech.end()
        self._wake.end()
        if stream is not None:  # closed before the client reads the request's end
            await stream.stop()
        with contextlib.suppress(ConnectionError):  # the peer may be gone already
            if self._audio_open:  # a reply cut short still ends: audio-stop, then why
                await self.write_event(AudioStop().event())
            await self.write_event(Error(text=error.message, code=error.code.value).event())
            if transcription:
                await end_transcript(self.write_event, started=started)

    # -- info ---------------------------------------------------------------------------

    async def _describe(self, event: Event) -> None:
        await self.write_event(server_info(self.runtime.engines).event())

    async def _ping(self, event: Event) -> None:
        await self.write_event(Pong(text=Ping.from_event(event).text).event())

    # -- ASR ------------------------------------------------------------------------------

    async def _transcribe(self, event: Event) -> None:
        self._failed = False  # a new request: a failed one's audio-stop will not come
        request = Transcribe.from_event(event)
        self._language = self.runtime.engines.check_language(request.language or None)

    async def _audio_start(self, event: Event) -> None:
        self._failed = False
        self._begin_asr(AudioStart.from_event(event))

    def _begin_asr(self, declared: AudioFormat) -> None:
        self._end_asr()
        audio = check_format(declared, whole=True)  # refused before any slot is taken
        self.runtime.engines  # noqa: B018 - raises not_ready before the models are loaded
        limit = self.runtime.settings.limits.max_upload_bytes
        max_s = self.runtime.settings.wyoming.max_audio_s
        if streams(audio.rate):
            self._stream = StreamedTranscription(
                self.runtime, audio.rate, self._language, self.write_event
            )
        else:
            self._asr = open_wyoming(self.runtime, "asr")
        self._recording = Recording(audio, limit, max_s, keep=self._stream is None)

    async def _audio_chunk(self, event: Event) -> None:
        chunk = AudioChunk.from_event(event)
        if self._recording is None:  # no audio-start: the first chunk says the format
            self._begin_asr(chunk)
        assert self._recording is not None
        stream = self._stream
        if stream is not None and stream.done:
            return  # the request ended with its error: the rest of its audio is dropped
        samples = self._recording.add(chunk)
        seconds = seconds_of(len(chunk.audio), self._recording.format)
        quotas_of(self.runtime).spend_audio(ANONYMOUS, seconds)
        if stream is not None:
            stream.add(samples)

    async def _audio_stop(self, event: Event) -> None:
        stream = self._stream
        if stream is not None and stream.done:  # it ended with its error, or was drained
            self._end_asr()
            return
        recording = self._recording
        if recording is None or (stream is not None and not recording.size):
            raise VoxError(ErrorCode.EMPTY_AUDIO, "audio-stop without audio")
        if stream is not None:
            try:  # the session's last events (or its error) are written by the stream
                await stream.finish()
            finally:
                self._end_asr()
            return
        try:
            samples = await at_16k(self.runtime.pools.decode, recording.chunks, recording.rate)
            result = await transcribe(self.runtime, samples, SAMPLE_RATE, language=self._language)
        finally:
            self._end_asr()
        await self.write_event(Transcript(text=result.text, language=result.language).event())

    def _end_asr(self) -> None:
        self._recording = None
        if self._stream is not None:
            self._stream.cancel()  # a no-op once its transcript is out
            self._stream = None
        if self._asr is not None:
            self._asr.release()
            self._asr = None


async def lingering_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Close a connection whose peer may still be sending: FIN first, then its bytes read
    and dropped until it closes too (at most LINGER_S), then the socket. A socket closed
    with unread input sends RST, and the peer's stack then drops what it had not read yet:
    the error that said why (idle_timeout, a limit) with it."""
    if not writer.is_closing() and not reader.at_eof():
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
        with contextlib.suppress(TimeoutError, OSError):
            async with asyncio.timeout(LINGER_S):
                while await reader.read(65_536):
                    pass
    writer.close()

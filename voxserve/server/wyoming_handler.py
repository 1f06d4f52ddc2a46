"""One Wyoming connection (Home Assistant's voice protocol): ASR, TTS and `describe`.

ASR: `transcribe` (optional: model name, language), `audio-start`, `audio-chunk`s,
`audio-stop` -> one `transcript`. Home Assistant runs its own VAD and sends one command per
request, so the audio is recognised whole at `audio-stop` (as an upload is), not turned into
segments. TTS: `synthesize` -> `audio-start`, `audio-chunk`s, `audio-stop`; streaming
`synthesize-start`, `synthesize-chunk`s, `synthesize-stop` speaks each sentence as soon as
it is complete, in one audio-start/stop, then `synthesize-stopped` (the `synthesize` that
Home Assistant also sends while streaming, for older servers, is ignored).

Errors are `error` events whose `code` is the voxserve code (docs/protocol.md); the
connection stays open. An error after `audio-start` (an engine failing mid-reply) comes
after that reply's `audio-stop`, so every reply begun is ended. Each request counts
against `limits.max_sessions` while it runs.

Events are read by `wyoming_protocol` (lengths capped, fields checked) instead of the
package's trusting reader; broken framing ends the connection after an `error`. A
connection silent for `limits.idle_timeout_s` (`idle_timeout`) or open for
`limits.max_session_s` (`session_expired`, checked between events) is closed after its
`error`. Wyoming carries no key: the caller is `anonymous` for quotas (`quotas.anonymous`),
each request is a session of it, and its audio is charged per chunk (over quota the
request ends with `quota_exceeded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable

import numpy as np
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from voxserve.audio.pcm import Int16Array
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.observe.logs import bind_session
from voxserve.pipeline.recognition import transcribe
from voxserve.pipeline.synthesis import check_text, first_audio, synthesize
from voxserve.runtime import Runtime
from voxserve.server.admission import admit
from voxserve.server.auth import ANONYMOUS
from voxserve.server.quotas import quotas_of
from voxserve.server.wyoming_info import server_info
from voxserve.server.wyoming_protocol import check_event, read_event
from voxserve.speakable import says_something
from voxserve.text import SentenceBuffer
from voxserve.types import SUPPORTED_OUTPUT_RATES, Voice

log = logging.getLogger(__name__)

TRANSPORT = "wyoming"
PCM_WIDTH = 2  # 16-bit samples in and out


class _Request:
    """The session slot one request holds (admission + active count), released once."""

    def __init__(self, runtime: Runtime, mode: str) -> None:
        admit(runtime)
        self.quota = quotas_of(runtime).open_session(ANONYMOUS)
        self.runtime = runtime
        self.mode = mode
        runtime.active_sessions += 1
        runtime.metrics.sessions_total.labels(mode).inc()
        runtime.metrics.sessions_active.labels(mode).inc()
        self._open = True

    def release(self) -> None:
        if self._open:
            self._open = False
            self.quota.release()
            self.runtime.active_sessions -= 1
            self.runtime.metrics.sessions_active.labels(self.mode).dec()


class _Recording:
    """Audio of one transcription, as 16-bit mono at the client's rate, under a byte cap."""

    def __init__(self, rate: int, limit: int) -> None:
        self.rate = rate
        self.limit = limit
        self.chunks: list[np.ndarray] = []
        self.size = 0

    def add(self, chunk: AudioChunk) -> None:
        if chunk.width != PCM_WIDTH:
            raise VoxError(
                ErrorCode.UNSUPPORTED_ENCODING,
                f"audio width {chunk.width} bytes is not supported; send 16-bit PCM (width 2)",
            )
        if chunk.rate != self.rate:
            raise VoxError(
                ErrorCode.UNSUPPORTED_SAMPLE_RATE,
                f"audio-chunk rate {chunk.rate} differs from audio-start's {self.rate}",
            )
        channels = max(1, chunk.channels)
        if len(chunk.audio) % (PCM_WIDTH * channels):
            raise VoxError(ErrorCode.ODD_LENGTH_PCM, "audio chunk ends inside a sample")
        self.size += len(chunk.audio)
        if self.size > self.limit:
            raise VoxError(
                ErrorCode.MESSAGE_TOO_LARGE, f"audio exceeds {self.limit} bytes for one request"
            )
        samples = np.frombuffer(chunk.audio, dtype="<i2")
        if channels > 1:  # mix down: ASR wants mono
            samples = samples.reshape(-1, channels).mean(axis=1).astype(np.int16)
        self.chunks.append(samples.astype(np.int16, copy=False))

    def samples(self) -> np.ndarray:
        if not self.chunks:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate(self.chunks)


class WyomingHandler(AsyncEventHandler):
    """Events of one connection, handled in order; state lives for one request."""

    def __init__(
        self, runtime: Runtime, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        super().__init__(reader, writer)
        self.runtime = runtime
        self.trace_id = uuid.uuid4().hex[:16]
        self._language: str | None = None
        self._recording: _Recording | None = None
        self._asr: _Request | None = None
        self._stream: SentenceBuffer | None = None  # set while a synthesize stream is open
        self._stream_voice: Voice | None = None
        self._stream_request: _Request | None = None
        self._stream_audio_started = False
        self._audio_open = False  # an audio-start was sent and its audio-stop not yet
        bind_session(self.trace_id)

    async def run(self) -> None:
        """Read events until the peer leaves, the framing breaks, or a limit ends the
        connection (the package's loop, with voxserve's reader and limits)."""
        self._is_running = True
        limits = self.runtime.settings.limits
        cap = limits.max_message_bytes
        expires_at = time.monotonic() + limits.max_session_s
        try:
            while self._is_running:
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
        finally:
            await self.disconnect()
            self.writer.close()

    def _limit_error(self, *, expired: bool) -> VoxError:
        limits = self.runtime.settings.limits
        if expired:
            limit = limits.max_session_s
            return VoxError(ErrorCode.SESSION_EXPIRED, f"connections last at most {limit:g} s")
        idle = limits.idle_timeout_s
        return VoxError(ErrorCode.IDLE_TIMEOUT, f"no event from the client for {idle:g} s")

    async def handle_event(self, event: Event) -> bool:
        handler = self._handlers().get(event.type)
        if handler is None:
            return True  # Wyoming peers drop events they do not know
        try:
            check_event(event)
            await handler(event)
        except VoxError as exc:
            await self._error(exc)
        except Exception:
            log.exception("wyoming event failed", extra={"event": event.type})
            await self._error(VoxError(ErrorCode.INTERNAL, "internal error; see server logs"))
        return True

    def _handlers(self) -> dict[str, Callable[[Event], Awaitable[None]]]:
        return {
            "describe": self._describe,
            "ping": self._ping,
            "transcribe": self._transcribe,
            "audio-start": self._audio_start,
            "audio-chunk": self._audio_chunk,
            "audio-stop": self._audio_stop,
            "synthesize": self._synthesize,
            "synthesize-start": self._synthesize_start,
            "synthesize-chunk": self._synthesize_chunk,
            "synthesize-stop": self._synthesize_stop,
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
        self._end_stream()

    async def _error(self, error: VoxError) -> None:
        self.runtime.metrics.errors.labels(error.code.value, TRANSPORT).inc()
        if error.code in (ErrorCode.OVERLOADED, ErrorCode.NOT_READY, ErrorCode.QUOTA_EXCEEDED):
            self.runtime.metrics.refused.labels(error.code.value).inc()
        # A failed request is over: its slot is free and its state forgotten.
        self._end_asr()
        self._end_stream()
        with contextlib.suppress(ConnectionError):  # the peer may be gone already
            if self._audio_open:  # a reply cut short still ends: audio-stop, then why
                await self.write_event(AudioStop().event())
            await self.write_event(Error(text=error.message, code=error.code.value).event())

    # -- info ---------------------------------------------------------------------------

    async def _describe(self, event: Event) -> None:
        await self.write_event(server_info(self.runtime.engines).event())

    async def _ping(self, event: Event) -> None:
        await self.write_event(Pong(text=Ping.from_event(event).text).event())

    # -- ASR ------------------------------------------------------------------------------

    async def _transcribe(self, event: Event) -> None:
        request = Transcribe.from_event(event)
        self._language = self.runtime.engines.check_language(request.language or None)

    async def _audio_start(self, event: Event) -> None:
        start = AudioStart.from_event(event)
        self._begin_asr(start.rate)

    def _begin_asr(self, rate: int) -> None:
        self._end_asr()
        self.runtime.engines  # noqa: B018 - raises not_ready before the models are loaded
        self._asr = _Request(self.runtime, "asr")
        self._recording = _Recording(rate, self.runtime.settings.limits.max_upload_bytes)

    async def _audio_chunk(self, event: Event) -> None:
        chunk = AudioChunk.from_event(event)
        if self._recording is None:  # no audio-start: the first chunk says the format
            self._begin_asr(chunk.rate)
        assert self._recording is not None
        self._recording.add(chunk)
        seconds = len(chunk.audio) / (PCM_WIDTH * max(1, chunk.channels) * chunk.rate)
        quotas_of(self.runtime).spend_audio(ANONYMOUS, seconds)

    async def _audio_stop(self, event: Event) -> None:
        recording = self._recording
        if recording is None:
            raise VoxError(ErrorCode.EMPTY_AUDIO, "audio-stop without audio")
        try:
            result = await transcribe(
                self.runtime, recording.samples(), recording.rate, language=self._language
            )
        finally:
            self._end_asr()
        await self.write_event(Transcript(text=result.text, language=result.language).event())

    def _end_asr(self) -> None:
        self._recording = None
        if self._asr is not None:
            self._asr.release()
            self._asr = None

    # -- TTS ------------------------------------------------------------------------------

    async def _synthesize(self, event: Event) -> None:
        if self._stream is not None:
            return  # sent for older servers alongside a stream; the stream says it all
        request = Synthesize.from_event(event)
        voice = self._voice(request.voice)
        text = check_text(request.text, self.runtime.settings.limits.max_text_chars)
        slot = _Request(self.runtime, "tts")
        try:
            rate = self._rate(voice)
            chunks = synthesize(self.runtime, text, voice=voice.id, sample_rate=rate, bulk=True)
            async with contextlib.aclosing(chunks):  # closed whatever fails after this
                # The first audio before audio-start: a text the voice says nothing for is
                # an `error` (empty_text), not an empty stream.
                first = await first_audio(chunks)
                await self._start_audio(voice)
                await self._send_audio(chunks, rate, first)
            await self.write_event(AudioStop().event())
        finally:
            slot.release()

    async def _synthesize_start(self, event: Event) -> None:
        request = SynthesizeStart.from_event(event)
        self._end_stream()
        voice = self._voice(request.voice)
        self._stream_request = _Request(self.runtime, "tts")
        self._stream_voice = voice
        self._stream = SentenceBuffer()
        self._stream_audio_started = False

    async def _synthesize_chunk(self, event: Event) -> None:
        if self._stream is None:
            raise VoxError(ErrorCode.NOT_STARTED, "synthesize-chunk before synthesize-start")
        text = SynthesizeChunk.from_event(event).text
        limit = self.runtime.settings.limits.max_text_chars
        if len(self._stream) + len(text) > limit:
            raise VoxError(ErrorCode.TEXT_TOO_LONG, f"pending text would exceed {limit} characters")
        for sentence in self._stream.push(text):
            await self._speak_streamed(sentence)

    async def _synthesize_stop(self, event: Event) -> None:
        SynthesizeStop.from_event(event)
        if self._stream is None:
            raise VoxError(ErrorCode.NOT_STARTED, "synthesize-stop before synthesize-start")
        try:
            rest = self._stream.flush()
            if rest:
                await self._speak_streamed(rest)
            if self._stream_audio_started:
                await self.write_event(AudioStop().event())
            await self.write_event(SynthesizeStopped().event())
        finally:
            self._end_stream()

    async def _speak_streamed(self, sentence: str) -> None:
        voice = self._stream_voice
        assert voice is not None
        if not says_something(sentence):
            return  # "..." between sentences: nothing to synthesise
        if not self._stream_audio_started:
            await self._start_audio(voice)
            self._stream_audio_started = True
        await self._speak(sentence, voice)

    def _end_stream(self) -> None:
        self._stream = None
        self._stream_voice = None
        if self._stream_request is not None:
            self._stream_request.release()
            self._stream_request = None

    async def _start_audio(self, voice: Voice) -> None:
        rate = self._rate(voice)
        await self.write_event(AudioStart(rate=rate, width=PCM_WIDTH, channels=1).event())

    async def _speak(self, text: str, voice: Voice) -> None:
        rate = self._rate(voice)
        await self._send_audio(
            # A one-shot request: behind live sessions' replies (pipeline/stage.py).
            synthesize(self.runtime, text, voice=voice.id, sample_rate=rate, bulk=True),
            rate,
        )

    async def _send_audio(
        self, chunks: AsyncGenerator[Int16Array, None], rate: int, first: Int16Array | None = None
    ) -> None:
        """`first` (already taken), then the rest of `chunks`, as audio-chunk events."""
        async with contextlib.aclosing(chunks):
            if first is not None:
                await self._send_chunk(first, rate)
            async for chunk in chunks:
                await self._send_chunk(chunk, rate)

    async def _send_chunk(self, chunk: Int16Array, rate: int) -> None:
        pcm = chunk.astype("<i2", copy=False).tobytes()
        event = AudioChunk(rate=rate, width=PCM_WIDTH, channels=1, audio=pcm).event()
        await self.write_event(event)

    def _rate(self, voice: Voice) -> int:
        """The voice's own rate when a client can take it (no resampling), else the
        server's output rate."""
        if voice.sample_rate in SUPPORTED_OUTPUT_RATES:
            return voice.sample_rate
        return self.runtime.settings.tts.output_sample_rate

    def _voice(self, wanted: SynthesizeVoice | None) -> Voice:
        """By name (a voice id or alias), else the first voice of the language, else the
        default voice."""
        engines = self.runtime.engines
        if wanted is not None and wanted.name:
            return engines.voice(wanted.name)[0]
        if wanted is not None and wanted.language:
            return _voice_for_language(engines.voices(), wanted.language)
        return engines.voice(None)[0]


def _voice_for_language(voices: list[Voice], language: str) -> Voice:
    """The first voice of exactly that language ("en_US"), else of its base ("en")."""
    want = language.replace("-", "_").lower()
    tags = [(voice, voice.language.replace("-", "_").lower()) for voice in voices]
    for voice, have in tags:
        if have == want:
            return voice
    for voice, have in tags:
        if have.split("_")[0] == want.split("_")[0]:
            return voice
    raise VoxError(ErrorCode.UNKNOWN_LANGUAGE, f"no voice speaks {quoted(language)}")

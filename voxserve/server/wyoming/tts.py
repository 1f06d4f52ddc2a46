"""Wyoming TTS on one connection: `synthesize`, and the streaming `synthesize-start`,
`synthesize-chunk`s, `synthesize-stop` (wyoming/handler.py says the protocol).

Each request is a session of the anonymous caller while it speaks, in Wyoming's share
(wyoming_seats' `open_wyoming`: admitted, counted, released once). Events go out through
the handler's `write_event`, which tracks whether a reply's audio is open.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.event import Event
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
from voxserve.pipeline.synthesis.request import check_text
from voxserve.pipeline.synthesis.synthesize import first_audio, synthesize
from voxserve.runtime import Runtime
from voxserve.server.wyoming.recording import PCM_WIDTH
from voxserve.server.wyoming.seats import WyomingSlot, open_wyoming
from voxserve.speakable import says_something
from voxserve.text import SentenceBuffer
from voxserve.types import SUPPORTED_OUTPUT_RATES, Voice


class WyomingSpeech:
    def __init__(self, runtime: Runtime, write_event: Callable[[Event], Awaitable[None]]) -> None:
        self.runtime = runtime
        self.write_event = write_event
        self._stream: SentenceBuffer | None = None  # set while a synthesize stream is open
        self._stream_voice: Voice | None = None
        self._stream_slot: WyomingSlot | None = None
        self._stream_audio_started = False

    async def synthesize(self, event: Event) -> None:
        if self._stream is not None:
            return  # sent for older servers alongside a stream; the stream says it all
        request = Synthesize.from_event(event)
        voice = self._voice(request.voice)
        text = check_text(request.text, self.runtime.settings.limits.max_text_chars)
        slot = open_wyoming(self.runtime, "tts")
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

    async def synthesize_start(self, event: Event) -> None:
        request = SynthesizeStart.from_event(event)
        self.end()
        voice = self._voice(request.voice)
        self._stream_slot = open_wyoming(self.runtime, "tts")
        self._stream_voice = voice
        self._stream = SentenceBuffer()
        self._stream_audio_started = False

    async def synthesize_chunk(self, event: Event) -> None:
        if self._stream is None:
            raise VoxError(ErrorCode.NOT_STARTED, "synthesize-chunk before synthesize-start")
        text = SynthesizeChunk.from_event(event).text
        limit = self.runtime.settings.limits.max_text_chars
        if len(self._stream) + len(text) > limit:
            raise VoxError(ErrorCode.TEXT_TOO_LONG, f"pending text would exceed {limit} characters")
        for sentence in self._stream.push(text):
            await self._speak_streamed(sentence)

    async def synthesize_stop(self, event: Event) -> None:
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
            self.end()

    def end(self) -> None:
        """Forget the open stream, if any, and free its slot (a failure, a disconnect)."""
        self._stream = None
        self._stream_voice = None
        if self._stream_slot is not None:
            self._stream_slot.release()
            self._stream_slot = None

    async def _speak_streamed(self, sentence: str) -> None:
        voice = self._stream_voice
        assert voice is not None
        if not says_something(sentence):
            return  # "..." between sentences: nothing to synthesise
        if not self._stream_audio_started:
            await self._start_audio(voice)
            self._stream_audio_started = True
        await self._speak(sentence, voice)

    async def _start_audio(self, voice: Voice) -> None:
        rate = self._rate(voice)
        await self.write_event(AudioStart(rate=rate, width=PCM_WIDTH, channels=1).event())

    async def _speak(self, text: str, voice: Voice) -> None:
        rate = self._rate(voice)
        await self._send_audio(
            # A one-shot request: behind live sessions' replies (pipeline/scheduling/stage.py).
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

"""The Wyoming wake service of one connection: `detect`, then `audio-start`, `audio-chunk`s,
`audio-stop` -> a `detection` (name, timestamp) each time a word is heard, and
`not-detected` at `audio-stop` when none was.

As the peer wyoming-microwakeword does: the stream goes on after a detection (a satellite
keeps streaming; the same word fires again only after `wake.refractory_s` of audio), and
`not-detected` is sent only when nothing was heard. Unlike it, a `detect` naming no model
listens for every enabled one (as wyoming-openwakeword does), and a name that is not an
enabled model is refused (`unknown_wake_word`, listing the valid ones) instead of dropped.
The timestamp is the detection's place in the audio (the end of the word, not the start of
its chunk) on the client's clock: ms from `audio-start`, shifted by the client's own chunk
`timestamp`s when it sends them (the peers echo the chunk's timestamp; Home Assistant's
count from 0 at its stream's start, so both agree there).

Each stream has its own state (engines/micro_wakeword.py: one interpreter per word per
stream) and holds a session slot from `audio-start` to `audio-stop`. Its audio is not
charged to the audio quota: a satellite streams all day for a service that costs ~2% of a
core per stream (docs/benchmarks.md); `limits.max_session_s` still bounds the connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial

from wyoming.audio import AudioChunk, AudioStart
from wyoming.event import Event
from wyoming.info import Attribution, WakeModel, WakeProgram
from wyoming.wake import Detect, Detection, NotDetected

from voxserve import __version__
from voxserve.audio.resample import StreamResampler
from voxserve.engines.micro_wakeword import WakeEngine, WakeStream, wake_names
from voxserve.errors import ErrorCode, VoxError
from voxserve.runtime import Runtime
from voxserve.server.auth import ANONYMOUS
from voxserve.server.session_slot import SessionSlot, open_request
from voxserve.server.wyoming_recording import AUDIO_EVENTS, mono_samples
from voxserve.types import SAMPLE_RATE

Write = Callable[[Event], Awaitable[None]]


def wake_programs(engine: WakeEngine | None) -> list[WakeProgram]:
    """`info`'s wake program: every enabled model with its phrase, languages and author."""
    if engine is None:
        return []
    models = []
    for name in engine.names:
        model = engine.model(name)
        models.append(
            WakeModel(
                name=name,
                attribution=Attribution(name=model.author, url=model.url),
                installed=True,
                description=model.phrase,
                version=model.version,
                languages=list(model.languages),
                phrase=model.phrase,
            )
        )
    info = engine.info
    return [
        WakeProgram(
            name="voxserve",
            attribution=Attribution(name=f"{info.package} ({info.license})", url=""),
            installed=True,
            description="voxserve wake words (microWakeWord)",
            version=__version__,
            models=models,
        )
    ]


class WyomingWake:
    """The detect flow of one connection; `route` says which audio events are its own."""

    def __init__(self, runtime: Runtime, write: Write) -> None:
        self.runtime = runtime
        self.write = write
        self._names: tuple[str, ...] | None = None  # a detect is open: its models
        self._stream: WakeStream | None = None
        self._slot: SessionSlot | None = None
        self._resampler: StreamResampler | None = None
        self._rate = SAMPLE_RATE
        self._heard = False
        self._refused = False  # the last detect was refused: its audio is dropped
        self._sent = 0  # 16 kHz samples given to the stream
        self._clock_ms = 0  # client timestamp minus our ms at its latest timestamped chunk

    def route(self, event_type: str) -> Callable[[Event], Awaitable[None]] | None:
        """This flow's handler for an audio event while a `detect` is open, else None. The
        audio after a refused `detect` (a satellite streams on) is dropped up to its
        `audio-stop` or the next other event: it must not start a transcription."""
        if event_type not in AUDIO_EVENTS:
            self._refused = False
            return None
        if self._refused:
            self._refused = event_type != "audio-stop"
            return self._drop
        if self._names is None:
            return None
        if event_type == "audio-start":
            return self._audio_start
        return self._audio_chunk if event_type == "audio-chunk" else self._audio_stop

    async def detect(self, event: Event) -> None:
        self.end()
        try:
            names = wake_names(self.runtime.engines.wake, Detect.from_event(event).names or ())
        except VoxError:
            self._refused = True
            raise
        self._names = names

    async def _drop(self, event: Event) -> None:
        return None

    async def _audio_start(self, event: Event) -> None:
        self._begin(AudioStart.from_event(event).rate)

    def _begin(self, rate: int) -> None:
        engine, names = self.runtime.engines.wake, self._names
        assert engine is not None and names is not None  # checked by `detect`
        self._close_stream()
        self._slot = open_request(self.runtime, ANONYMOUS, "wake")
        self._stream = engine.new_stream(names)
        self._rate = rate
        self._resampler = StreamResampler(rate, SAMPLE_RATE)
        self._heard = False
        self._sent = self._clock_ms = 0

    async def _audio_chunk(self, event: Event) -> None:
        try:
            await self._chunk(event)
        except VoxError:  # said once: the rest of this audio is dropped (`route`)
            self._refused = True
            raise

    async def _chunk(self, event: Event) -> None:
        chunk = AudioChunk.from_event(event)
        if self._stream is None:  # no audio-start: the first chunk says the format
            self._begin(chunk.rate)
        stream, resampler = self._stream, self._resampler
        assert stream is not None and resampler is not None
        samples = resampler.process(mono_samples(chunk, self._rate))
        if chunk.timestamp is not None:  # the client's clock at this chunk's first sample
            self._clock_ms = int(chunk.timestamp) - self._sent * 1000 // SAMPLE_RATE
        self._sent += samples.size
        if not samples.size:
            return
        loop = asyncio.get_running_loop()
        pcm = samples.astype("<i2", copy=False).tobytes()
        heard = await loop.run_in_executor(self.runtime.executor, partial(stream.process, pcm))
        for detection in heard:
            self._heard = True
            timestamp = detection.timestamp_ms + self._clock_ms
            await self.write(Detection(detection.name, timestamp).event())

    async def _audio_stop(self, event: Event) -> None:
        if self._stream is None:
            self.end()
            raise VoxError(ErrorCode.EMPTY_AUDIO, "audio-stop without audio")
        heard = self._heard
        self.end()
        if not heard:
            await self.write(NotDetected().event())

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._slot is not None:
            self._slot.release()
            self._slot = None

    def end(self) -> None:
        """Forget the detect (after `audio-stop`, an error, the peer leaving)."""
        self._close_stream()
        self._names = None
        self._resampler = None

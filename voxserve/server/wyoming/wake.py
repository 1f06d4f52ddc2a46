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
stream) and holds a session slot, in Wyoming's share (wyoming/seats.py), from `audio-start`
to `audio-stop`. Its audio is not charged to the audio quota: a satellite streams all day
for a service that costs ~2% of a core per stream (docs/benchmarks.md);
`limits.max_session_s` still bounds the connection.

Audio is checked on the event loop (its format once, at `audio-start`: the live rates
only, so resampling to 16 kHz at most doubles it; each chunk against it) and everything
else, mixing down, resampling and the model, runs in the model executor (`WakeAudio`), in
batches of at least `BATCH_MS`, so a flood of tiny chunks is not one executor call each;
a chunk is at most `limits.max_message_bytes`. A rate of 1 was once upsampled 16,000x on
the event loop (issue 35). A refused `audio-start` or chunk is said once, like a refused
`detect`: the rest of that audio is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial

from wyoming.audio import AudioChunk, AudioFormat, AudioStart
from wyoming.event import Event
from wyoming.info import Attribution, WakeModel, WakeProgram
from wyoming.wake import Detect, Detection, NotDetected

from voxserve import __version__
from voxserve.audio.resample import StreamResampler
from voxserve.engines.micro_wakeword import Detection as Heard
from voxserve.engines.micro_wakeword import WakeEngine, WakeStream, wake_names
from voxserve.errors import ErrorCode, VoxError
from voxserve.runtime import Runtime
from voxserve.server.wyoming.recording import (
    AUDIO_EVENTS,
    PCM_WIDTH,
    check_chunk,
    check_format,
    mono,
)
from voxserve.server.wyoming.seats import WyomingSlot, open_wyoming
from voxserve.types import SAMPLE_RATE

Write = Callable[[Event], Awaitable[None]]
BATCH_MS = 20  # audio gathered before an executor call (satellites send 64 ms chunks)


async def drop(event: Event) -> None:
    """The handler `route` gives a refused detection's audio: dropped, unread."""


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


class WakeAudio:
    """One detect stream's audio: checked chunks gathered on the event loop (`add`), heard
    in the executor (`hear`: mixed down, resampled to 16 kHz, given to the model)."""

    def __init__(self, audio: AudioFormat, stream: WakeStream) -> None:
        self.format = audio
        self.stream = stream
        self.received = 0  # samples per channel since audio-start, at the client's rate
        self._resampler = StreamResampler(audio.rate, SAMPLE_RATE)
        self._frame = PCM_WIDTH * audio.channels
        self._batch = audio.rate * BATCH_MS // 1000 * self._frame
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def add(self, pcm: bytes) -> bytes | None:
        """Gather a checked chunk's PCM; the batch to hear once `BATCH_MS` are in."""
        self.received += len(pcm) // self._frame
        self._pending.append(pcm)
        self._pending_bytes += len(pcm)
        return self.take() if self._pending_bytes >= self._batch else None

    def take(self) -> bytes:
        """What is gathered, as one batch (empty when nothing is)."""
        pcm = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        return pcm

    def hear(self, pcm: bytes) -> list[Heard]:
        """In the executor: one batch to the model; one call at a time per stream (the
        handler awaits each), so the resampler's state is never shared."""
        samples = self._resampler.process(mono(pcm, self.format.channels))
        if not samples.size:
            return []
        return self.stream.process(samples.astype("<i2", copy=False).tobytes())


class WyomingWake:
    """The detect flow of one connection; `route` says which audio events are its own."""

    def __init__(self, runtime: Runtime, write: Write) -> None:
        self.runtime = runtime
        self.write = write
        self._names: tuple[str, ...] | None = None  # a detect is open: its models
        self._stream: WakeStream | None = None
        self._audio: WakeAudio | None = None  # the open stream's audio path
        self._slot: WyomingSlot | None = None
        self._heard = False
        self._refused = False  # the last detect or its audio was refused: audio dropped
        self._clock_ms = 0  # client timestamp minus our ms at its latest timestamped chunk

    def route(self, event_type: str) -> Callable[[Event], Awaitable[None]] | None:
        """This flow's handler for an audio event while a `detect` is open, else None. The
        audio after a refused `detect` (a satellite streams on) is dropped up to its
        `audio-stop` or the next other event: it must not start a transcription."""
        if event_type not in AUDIO_EVENTS:
            self._refused = False
            return None
        if self._refused:
            self.refuse(event_type)
            return drop
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

    def refuse(self, event_type: str) -> None:
        """This flow's audio event was refused (its fields, format, a slot): said once, the
        rest of that audio is dropped up to its `audio-stop` (`route`)."""
        self._refused = event_type != "audio-stop"

    async def _audio_start(self, event: Event) -> None:
        self._begin(AudioStart.from_event(event))

    def _begin(self, declared: AudioFormat) -> None:
        engine, names = self.runtime.engines.wake, self._names
        assert engine is not None and names is not None  # checked by `detect`
        self._close_stream()
        audio = check_format(declared)  # before a slot is taken
        self._slot = open_wyoming(self.runtime, "wake")
        self._stream = engine.new_stream(names)
        self._audio = WakeAudio(audio, self._stream)
        self._heard = False
        self._clock_ms = 0

    async def _audio_chunk(self, event: Event) -> None:
        chunk = AudioChunk.from_event(event)
        if self._audio is None:  # no audio-start: the first chunk says the format
            self._begin(chunk)
        audio = self._audio
        assert audio is not None
        check_chunk(chunk, audio.format)
        if chunk.timestamp is not None:  # the client's clock at this chunk's first sample
            self._clock_ms = int(chunk.timestamp) - audio.received * 1000 // audio.format.rate
        batch = audio.add(chunk.audio)
        if batch:
            await self._hear(audio, batch)

    async def _hear(self, audio: WakeAudio, pcm: bytes) -> None:
        loop = asyncio.get_running_loop()
        heard = await loop.run_in_executor(self.runtime.executor, partial(audio.hear, pcm))
        for detection in heard:
            self._heard = True
            timestamp = detection.timestamp_ms + self._clock_ms
            await self.write(Detection(detection.name, timestamp).event())

    async def _audio_stop(self, event: Event) -> None:
        audio = self._audio
        if audio is None:
            self.end()
            raise VoxError(ErrorCode.EMPTY_AUDIO, "audio-stop without audio")
        rest = audio.take()
        if rest:  # the last few ms gathered
            await self._hear(audio, rest)
        heard = self._heard
        self.end()
        if not heard:
            await self.write(NotDetected().event())

    def _close_stream(self) -> None:
        self._audio = None
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

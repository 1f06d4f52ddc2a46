"""One Wyoming transcription as a live `asr` session, so text streams while audio comes.

The request's audio goes into a session opened by the session driver like every
transport's (its VAD, partials, finals, limits, drain); its partial and final transcripts
come back as Wyoming >= 1.7 streaming events: `transcript-start`, `transcript-chunk`s
(wyoming_chunks: append-only), then at `audio-stop`, once the session has decoded the
last final, the remaining chunk, `transcript` (the finals joined: the same text as the
chunks unless a partial sent words the final took back) and `transcript-stop`.
Clients before 1.7 skip the events they do not know and read `transcript` as before.

Wyoming differs from the WebSocket in three ways. Its audio is charged to the quota by
the handler as each chunk arrives (an over-quota chunk is answered by `quota_exceeded` at
once), so the driver does not charge it again. Any error the session reports ends the
request with that `error` (a Wyoming request has no place for an error it goes on after),
then an empty `transcript` and, once `transcript-start` is out, `transcript-stop`
(`end_transcript`: Home Assistant skips `error` and waits for `transcript`); the rest of
its audio is dropped. Chunks of any size are cut into the session's 20 ms
frames here.

A pause in a command longer than the VAD's hangover (`vad.hangover_ms`, 500 ms) cuts it
into segments decoded apart, and the first loses its context: "Set a timer for" / 700 ms
/ "five minutes" came out "Set a timer for it. Five minutes." where the whole recording
gives "Set a timer for 5 minutes." (Whisper base). The client's own VAD decides where a
Wyoming command ends (`requires_external_vad`), so when the session heard more than one
segment, `transcript` is the whole request's audio recognised in one go (as before
streaming; the chunks stay a preview, and the audio is joined and resampled in the
decode pool); one segment (most commands) keeps its final.

A recording sent at once (its audio came faster than `asr.partial_max_speed` times real
time, and nothing was streamed yet) is what a one-shot client sends: at `audio-stop` its
session is closed and the whole audio recognised in one go, as an upload is. Its session
would otherwise judge the whole recording with the VAD first and then decode it segment by
segment, with the client waiting on both; a one-shot client reads only `transcript`.

The request holds a place in Wyoming's share (wyoming/seats.py) from its admission until
its session is closed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import numpy as np
from wyoming.asr import Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.error import Error
from wyoming.event import Event

from voxserve.events import (
    EndMessage,
    ErrorEvent,
    SessionEnded,
    StreamConfig,
    TranscriptFinal,
    TranscriptPartial,
)
from voxserve.pipeline.recognition.bulk import transcribe
from voxserve.runtime import Runtime
from voxserve.server.session.admission import admit
from voxserve.server.session.attachment import serve_attached
from voxserve.server.session.auth import ANONYMOUS
from voxserve.server.session.driver import SessionDriver
from voxserve.server.session.input import ClientInput, Decoded, Frames, InputEnd, Wire
from voxserve.server.wyoming.chunks import TranscriptChunks
from voxserve.server.wyoming.recording import at_16k
from voxserve.server.wyoming.seats import seats_of
from voxserve.types import FRAME_MS, SAMPLE_RATE, SUPPORTED_INPUT_RATES

log = logging.getLogger(__name__)

# The handler charges each chunk as it comes (docstring), so the driver does not.
WYOMING = Wire(
    "wyoming", in_band_end=True, stalls=False, tasks="voxserve-wyoming", charges_audio=False
)
SEQ_MOD = 1 << 32
Write = Callable[[Event], Awaitable[None]]
Message = Frames | EndMessage  # what the handler hands the session: audio, then the end


async def end_transcript(write: Write, *, started: bool) -> None:
    """A failed transcription's end, after its `error`: an empty `transcript`, and
    `transcript-stop` if `transcript-start` was sent (a stream begun is ended)."""
    await write(Transcript(text="").event())
    if started:
        await write(TranscriptStop().event())


def streams(rate: int) -> bool:
    """A live session takes these rates; others are recognised whole at `audio-stop`."""
    return rate in SUPPORTED_INPUT_RATES


class QueuedInput:
    """The request's audio as the driver's way in: frames the handler puts, then the end."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Message] = asyncio.Queue()

    def put(self, item: Message) -> None:
        self._queue.put_nowait(item)

    async def receive(self) -> Message | InputEnd:
        return await self._queue.get()

    def decode(self, message: Message) -> Decoded:
        return message

    def release(self) -> None:
        """Nothing is held back: the handler hands each chunk over as it comes."""


class StreamedTranscription:
    """One request's session, from `audio-start` to its `transcript-stop`."""

    def __init__(self, runtime: Runtime, rate: int, language: str | None, write: Write) -> None:
        """Admitted and opened at once (refusals raise, fatal: the request is refused)."""
        admit(runtime)  # the global rule first: `overloaded` says more than the share
        batcher = runtime.generation.asr_batcher()
        self._seat = seats_of(runtime).take_session()
        config = StreamConfig(mode="asr", sample_rate=rate, language=language, partials=True)
        try:
            self.driver = SessionDriver.open(
                runtime, lambda: config, wire=WYOMING, principal=ANONYMOUS
            )
        except BaseException:
            self._seat.release()
            raise
        self._write = write
        self._input = QueuedInput()
        self._frame = rate * FRAME_MS // 1000 * 2  # bytes of one 20 ms frame
        self._seq = 0
        self._started = False  # transcript-start sent
        self._language = language
        self._chunks = TranscriptChunks()
        self._runtime = runtime
        self._rate = rate
        self._audio: list[np.ndarray] = []  # for a request the VAD cut in two (docstring)
        self._samples = 0  # of audio taken, at the request's rate
        self._first_at: float | None = None  # monotonic, when the first audio came
        self._max_speed = runtime.settings.asr.partial_max_speed  # 0: always streamed
        self._whole = False  # recognised whole at audio-stop (`finish`)
        self._batcher = batcher
        self._on_its_way = False  # counted in the batcher's bulk on its way (`_arriving`)
        self.driver.start()
        self.driver.announce()
        self.task = asyncio.get_running_loop().create_task(
            self._serve(), name="voxserve-wyoming-transcription"
        )
        # Closed however the task ends, even cancelled before it ran (`_serve` never began).
        self.task.add_done_callback(lambda _: self._close())

    @property
    def done(self) -> bool:
        return self.task.done()

    @property
    def started(self) -> bool:
        """`transcript-start` is out: the request's end includes `transcript-stop`."""
        return self._started

    def add(self, samples: np.ndarray) -> None:
        """Mono 16-bit samples at the request's rate, as 20 ms frames (the last may be short)."""
        self._audio.append(samples)
        if self._first_at is None:
            self._first_at = time.monotonic()
        self._samples += samples.size
        self._arriving(self._sent_at_once())
        pcm = memoryview(np.ascontiguousarray(samples, dtype="<i2").tobytes())
        frames: Frames = []
        for start in range(0, len(pcm), self._frame):
            frames.append((self._seq, pcm[start : start + self._frame]))
            self._seq = (self._seq + 1) % SEQ_MOD
        if frames:
            self._input.put(frames)

    async def finish(self) -> None:
        """No more audio: wait for the last final and the closing events; a recording
        sent at once is recognised whole instead (docstring)."""
        if self._sent_at_once():
            self._whole = True
            self.cancel()  # its VAD and decodes stop while the whole is recognised
            try:
                await self._recognise_whole()
            finally:  # its place is given back however it ends (cancelled, failed)
                self._arriving(False)
                self._seat.release()
                await asyncio.wait([self.task])
            return
        self._arriving(False)
        self._input.put(EndMessage("audio.end"))
        await asyncio.wait([self.task])

    def _sent_at_once(self) -> bool:
        """The audio came faster than `asr.partial_max_speed` x real time, and the client
        has been sent nothing yet (no chunk to keep the transcript consistent with)."""
        if self._max_speed <= 0 or self._started or self._first_at is None or self.done:
            return False
        audio_s = self._samples / self._rate
        return (time.monotonic() - self._first_at) * self._max_speed < audio_s

    def _arriving(self, at_once: bool) -> None:
        """Tell the batcher whether this request is a one-shot recording still arriving
        (Batcher.expect_bulk): in a burst, the first at `audio-stop` waits for the rest
        instead of going to Whisper alone."""
        if at_once != self._on_its_way and self._batcher is not None:
            self._batcher.expect_bulk(1 if at_once else -1)
            self._on_its_way = at_once

    async def _recognise_whole(self) -> None:
        """The request's audio recognised in one go (an upload's way), then its end. Its
        errors (`overloaded`, say) are the handler's to write, as a whole request's are."""
        audio = await at_16k(self._runtime.pools.decode, self._audio, self._rate)
        # Here, and admitted (or refused) before transcribe's first await: a burst's first
        # request never sees this one as neither on its way nor reserved.
        self._arriving(False)
        result = await transcribe(self._runtime, audio, SAMPLE_RATE, language=self._language)
        await asyncio.wait([self.task])  # closed, and its places free, before the end
        self._seat.release()
        self._language = self._language or result.language or None
        await self._start()
        await self._write(Transcript(text=result.text.strip(), language=self._language).event())
        await self._write(TranscriptStop().event())

    def cancel(self) -> None:
        """The request is over without its transcript (an error, the client left)."""
        if not self.task.done():
            self.task.cancel()

    async def stop(self) -> None:
        """`cancel`, and wait until the session is closed (its slot free), as a request
        that completes frees it before its end is written (`_session_over`)."""
        self.cancel()
        await asyncio.wait([self.task])

    async def _serve(self) -> None:
        driver = self.driver
        source: ClientInput[Message] = self._input
        try:
            await serve_attached(driver, source, self._send(), since=time.monotonic())
        finally:
            self._close()
            await driver.wait_closed()

    async def _send(self) -> None:
        """The session's events as Wyoming's, until the session ends or fails."""
        outbox = self.driver.session.outbox
        ended: SessionEnded | None = None
        while (item := await outbox.next()) is not None:
            match item:
                case TranscriptPartial():
                    await self._chunk(self._chunks.partial(item.segment, item.text))
                case TranscriptFinal():
                    self._language = self._language or item.language or None
                    await self._chunk(self._chunks.final(item.segment, item.text))
                case ErrorEvent():
                    await self._session_over(cancel=True)
                    await self._write(Error(text=item.message, code=item.code).event())
                    await end_transcript(self._write, started=self._started)
                    return
                case SessionEnded():
                    ended = item
                case _:
                    pass  # VAD, credit and the like: Wyoming has no words for them
        if ended is None:
            await self._session_over(cancel=False)
            return  # the client read nothing (stalled): nobody to tell
        # Ended without an error (completed, or the server drained it: what was heard so
        # far is decoded first): the transcript of the audio it took.
        text = await self._transcript()
        await self._session_over(cancel=False)
        if not self._started:
            await self._start()
        await self._write(Transcript(text=text, language=self._language).event())
        await self._write(TranscriptStop().event())

    async def _transcript(self) -> str:
        """The finals joined; the whole audio recognised at once if the VAD cut the
        request (docstring), the finals again if that fails (overload, say)."""
        if self._chunks.spoken_segments < 2:
            return self._chunks.transcript
        try:
            audio = await at_16k(self._runtime.pools.decode, self._audio, self._rate)
            whole = await transcribe(self._runtime, audio, SAMPLE_RATE, language=self._language)
        except Exception as exc:
            log.warning("wyoming: whole recognition failed", extra={"error": repr(exc)})
            return self._chunks.transcript
        self._language = self._language or whole.language or None
        return whole.text.strip()

    async def _session_over(self, *, cancel: bool) -> None:
        """The session's slot is free before the client reads the request's end (so the
        client may open the next at once, under `limits.max_sessions` too): its pipeline
        ends (it closed the outbox; after an error, it is stopped), then it is closed."""
        pipeline = self.driver.pipeline
        if pipeline is not None and not pipeline.done():
            if cancel:
                pipeline.cancel()
            await asyncio.wait([pipeline])
        self._close()

    def _close(self) -> None:
        """The session closed and its place in Wyoming's share given back (both once; a
        recording recognised whole keeps its place, and its word that it is on its way,
        until its transcript is out)."""
        self.driver.close()
        if not self._whole:
            self._arriving(False)
            self._seat.release()

    async def _start(self) -> None:
        self._started = True
        await self._write(TranscriptStart(language=self._language).event())

    async def _chunk(self, text: str | None) -> None:
        if not text:
            return
        if not self._started:
            await self._start()
        await self._write(TranscriptChunk(text=text).event())

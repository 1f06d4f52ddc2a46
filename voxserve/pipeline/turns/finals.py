"""Final transcripts: every ended turn is decoded, in order, by one worker per stream.

Apart from the listener because finals are the turn's result and its latency: one worker
takes the ended turns from a short queue (FINAL_QUEUE), so the recognizer state of one
utterance (its audio) never mixes with the next or with another stream's; it reuses the
decode speculation started at the turn's pause (speculation.py) when that one succeeded,
sends the final (or the failure: an error event, or a conversation's TranscriptFailed) and
then calls `on_final`. The turn's latency marks (vad.end time, tracing spans) are kept here
because the final is where they are read.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from voxserve.audio.pcm import Int16Array
from voxserve.errors import VoxError
from voxserve.events import TranscriptFailed, TranscriptFinal
from voxserve.observe.tracing import TurnMarks
from voxserve.pipeline.turns.listen_state import ListenState, ms
from voxserve.types import AsrResult

FINAL_QUEUE = 4  # utterances waiting for their final decode before the listener waits
KEPT_TURNS = 8  # segments whose vad.end time is kept for the final and turn latencies


@dataclass(frozen=True, slots=True)
class Utterance:
    segment: int
    start: int
    end: int
    audio: Int16Array
    decoded: asyncio.Task[AsrResult | VoxError] | None = None  # decoded at its pause


class Finals:
    """The finals of one stream; each call is handed the stream (listen_state.py)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Utterance | None] = asyncio.Queue(FINAL_QUEUE)
        # Latency observations (voxserve.observe.metrics): perf_counter time of vad.end per
        # recent segment.
        self._ended_at: dict[int, float] = {}
        self._turn_marks: dict[int, TurnMarks] = {}  # tracing on only

    async def put(self, utterance: Utterance | None) -> None:
        """An ended turn to decode (waits while FINAL_QUEUE are waiting); None: no more."""
        await self._queue.put(utterance)

    def turn_started(self, stream: ListenState) -> None:
        """`stream.segment` began (its vad.start is queued)."""
        if stream.tracing:
            turn = self._turn_marks[stream.segment] = TurnMarks(stream.segment)
            turn.mark("vad.start")

    def turn_ended(self, segment: int) -> None:
        """`segment` ended (its vad.end, or its commit, is queued)."""
        self._ended_at[segment] = time.perf_counter()
        self._ended_at.pop(segment - KEPT_TURNS, None)
        if segment in self._turn_marks:  # only with tracing on
            self._turn_marks[segment].mark("vad.end")

    def speech_ended_at(self, segment: int) -> float | None:
        """perf_counter time vad.end of `segment` was sent (recent segments only)."""
        return self._ended_at.get(segment)

    def take_turn(self, segment: int) -> TurnMarks | None:
        """The span marks of `segment` (tracing on), for the reply to complete and emit."""
        return self._turn_marks.pop(segment, None)

    def release(self) -> None:
        self._ended_at.clear()
        self._turn_marks.clear()

    async def worker(self, stream: ListenState) -> None:
        """Decode the queued turns one after another until None."""
        while (utterance := await self._queue.get()) is not None:
            stream.finalized = max(stream.finalized, utterance.segment)
            try:
                decoded = await utterance.decoded if utterance.decoded is not None else None
                if isinstance(decoded, AsrResult):  # decoded at the pause that ended it
                    result = decoded
                else:  # none, or it failed then (busy, ...): the turn's own decode, as ever
                    result = await stream.recognise(utterance.audio, partial_result=False)
            except VoxError as exc:
                await self._failed(stream, utterance.segment, exc)
                continue
            text = result.text.strip()
            await stream.outbox.event(
                TranscriptFinal(
                    segment=utterance.segment,
                    text=text,
                    start_ms=ms(utterance.start),
                    end_ms=ms(utterance.end),
                    language=result.language,
                )
            )
            ended = self._ended_at.get(utterance.segment)
            if ended is not None:
                stream.metrics.observe_final(time.perf_counter() - ended)
            if stream.tracing:
                self._final_marked(stream, utterance.segment, spoken=bool(text))
            if stream.on_final is not None and (text or stream.in_conversation):
                await stream.on_final(utterance.segment, text)

    def _final_marked(self, stream: ListenState, segment: int, *, spoken: bool) -> None:
        turn = self._turn_marks.get(segment)
        if turn is None:
            return
        turn.mark("asr.final")
        for old in [s for s in self._turn_marks if s < segment - KEPT_TURNS]:
            del self._turn_marks[old]
        if stream.on_final is None or not spoken:  # no reply follows: the turn ends here
            del self._turn_marks[segment]
            if stream.turn_done is not None:
                stream.turn_done(turn)

    async def _failed(self, stream: ListenState, segment: int, error: VoxError) -> None:
        """A final that could not be decoded: an error event (/v1/stream), or the turn's
        TranscriptFailed and `on_failed` (conversation sessions)."""
        if not stream.in_conversation:
            await stream.outbox.event(error.to_event(segment=segment))
            return
        await stream.outbox.event(
            TranscriptFailed(
                segment=segment,
                item_id=stream.item_id(segment),
                code=error.code.value,
                message=error.message,
            )
        )
        if stream.on_failed is not None:
            await stream.on_failed(segment, error)

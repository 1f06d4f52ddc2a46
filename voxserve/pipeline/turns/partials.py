"""Partial transcripts: while a turn is spoken, its growing audio is re-decoded now and then.

Apart from the listener because partials are best effort and have rules of their own: one
at a time, at most every `partial_every` samples, none while the ASR stage has finals
waiting or bulk work short of its share (they never queue behind a final), and none sent
once the turn's final is out. Finals (finals.py) are the opposite: every turn gets one, in
order.
"""

from __future__ import annotations

import asyncio
import logging
import time

from voxserve.audio.pcm import Int16Array
from voxserve.errors import VoxError
from voxserve.events import TranscriptPartial
from voxserve.pipeline.turns.listen_state import ListenState, ms
from voxserve.types import SAMPLE_RATE

log = logging.getLogger(__name__)


class Partials:
    """The partials of one stream; each call is handed the stream (listen_state.py)."""

    def __init__(self, min_partial_ms: int) -> None:
        self.min_partial = min_partial_ms * SAMPLE_RATE // 1000
        self._last_at = 0  # where the last partial was decoded up to
        self._last_text = ""
        self._task: asyncio.Task[None] | None = None
        # Latency observation (voxserve.observe.metrics): perf_counter time of vad.start,
        # until the segment's first partial.
        self._speech_started_at = 0.0
        self._pending = False

    def turn_starts(self, start: int) -> None:
        """A new turn (before its vad.start is queued): the next partial is its own."""
        self._last_at = start
        self._last_text = ""

    def speech_started(self) -> None:
        """Its vad.start is queued: the first partial's latency runs from now."""
        self._speech_started_at = time.perf_counter()
        self._pending = True

    def maybe(self, stream: ListenState, group: asyncio.TaskGroup) -> None:
        """After new VAD probabilities while speaking: a partial if one is due."""
        start = stream.turns.speech_start
        now = stream.turns.position
        if not stream.partials or start is None or now - start < self.min_partial:
            return
        if now - self._last_at < stream.partial_every:
            return
        if self._task is not None and not self._task.done():
            return
        stage = stream.ctx.stages.stage("asr")
        if stage.live_waiting or stage.bulk_short:
            return  # best effort: never queue behind finals, nor take bulk's share of slots
        self._last_at = now
        audio = stream.audio.slice(max(start - stream.pad, stream.kept_from), now)
        self._task = group.create_task(
            self._partial(stream, stream.segment, start, now, audio), name="voxserve-asr-partial"
        )

    async def _partial(
        self, stream: ListenState, segment: int, start: int, end: int, audio: Int16Array
    ) -> None:
        try:
            result = await stream.recognise(audio, partial_result=True)
        except VoxError as exc:
            log.debug("partial skipped", extra={"code": exc.code.value})
            return
        if segment <= stream.finalized or segment != stream.segment:
            return  # the final for this segment is out (or on its way): never send after it
        text = result.text.strip()
        if text and text != self._last_text:
            self._last_text = text
            if self._pending:
                self._pending = False
                stream.metrics.observe_first_partial(time.perf_counter() - self._speech_started_at)
            await stream.outbox.event(
                TranscriptPartial(segment=segment, text=text, start_ms=ms(start), end_ms=ms(end))
            )

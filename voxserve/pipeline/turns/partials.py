"""Partial transcripts: while a turn is spoken, its growing audio is re-decoded now and then.

Apart from the listener because partials are best effort and have rules of their own: one
at a time, at most every `partial_every` samples, none while the ASR stage has finals
waiting or bulk work short of its share (they never queue behind a final), and none sent
once the turn's final is out. Finals (finals.py) are the opposite: every turn gets one, in
order.

Nor while the audio comes much faster than it plays: a recording sent at once (a one-shot
Wyoming request, say) or a backlog being caught up. A partial then is stale before it is
sent, the final is moments away, and each is a whole decode taken from the final's CPU: one
client's one-shot Wyoming requests cost 39 decodes for 18 finals. Two signs, either enough
(`asr.partial_max_speed` 0 turns both off), over the stretch since the last partial or the
turn's start: the input held the client back (its credit window or the ring full: it sends
faster than this server judges, however fast that is, so a busy machine does not turn a
recording sent at once into a paced one), or judging ran faster than `partial_max_speed` x
real time (the audio keeps up with a fast sender).
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

    def __init__(self, min_partial_ms: int, max_speed: float) -> None:
        self.min_partial = min_partial_ms * SAMPLE_RATE // 1000
        self._max_speed = max_speed  # 0: any pace
        self._last_at = 0  # where the last partial was decoded up to
        self._last_text = ""
        # Where the audio was, when (perf_counter) and the stream's input_held count, at
        # the last partial or the turn's start: how fast the audio came since.
        self._paced_from = (0, 0.0, 0)
        self._task: asyncio.Task[None] | None = None
        # Latency observation (voxserve.observe.metrics): perf_counter time of vad.start,
        # until the segment's first partial.
        self._speech_started_at = 0.0
        self._pending = False

    def turn_starts(self, start: int, position: int, input_held: int) -> None:
        """A new turn (before its vad.start is queued), heard at `position` (the stream's
        input_held then): the next partial is its own."""
        self._last_at = start
        self._last_text = ""
        self._paced_from = (position, time.perf_counter(), input_held)

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
        at, then, held = self._paced_from
        if now <= at:
            return  # no audio since the turn was heard: no pace to judge yet (next round)
        wall, held_now = time.perf_counter(), stream.input_held
        if self._max_speed and (
            held_now > held or (now - at) / SAMPLE_RATE > self._max_speed * (wall - then)
        ):
            self._last_at = now  # skipped: the next is due an interval on, paced from here
            self._paced_from = (now, wall, held_now)
            return
        if self._task is not None and not self._task.done():
            return
        stage = stream.ctx.stages.stage("asr")
        if stage.live_waiting or stage.bulk_short:
            return  # best effort: never queue behind finals, nor take bulk's share of slots
        self._last_at = now
        self._paced_from = (now, wall, held_now)
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

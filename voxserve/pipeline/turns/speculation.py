"""Speculation and semantic turn detection: the final decoded at a pause, before the turn ends.

At a tentative end (`SpeechPause`, vad.speculate_ms of silence) the turn so far is decoded at
once, on the audio up to where VAD heard the speech stop (vad.pause_tail_ms more: Whisper
fills trailing silence with made-up words); a turn that ends there keeps that decode as its
final unless sound follows the VAD's end within vad.pad_ms (a stop's release after its closure,
word_tail.py): then the listener decodes the final again up to where that sound ends. With
semantic_vad its text decides how long the
silence must last (endpointing.py), and the turn's final reuses that decode; while the turn
is not confirmed `on_speculate` may start a held-back reply, and `on_resume` withdraws it if
the user goes on (voxserve_speculative_cancelled_total).

Apart from the listener because it is the one part that runs ahead of the turns: its decode
comes back while later audio is being judged, and is then judged in its place in the audio
(the listener's controls), like a client's control.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from voxserve.audio.pcm import Int16Array
from voxserve.errors import VoxError
from voxserve.events import TurnDetection
from voxserve.pipeline.turns.detection import SpeechEnd, SpeechPause
from voxserve.pipeline.turns.endpointing import EARLY_TURN_S, EndOfTurn, trailing_energy
from voxserve.pipeline.turns.listen_state import ListenState
from voxserve.types import SAMPLE_RATE, AsrResult

Later = Callable[[Callable[[], Awaitable[None]]], None]  # run this in its place in the audio
OnTurn = Callable[[SpeechEnd], Awaitable[None]]  # the listener's handling of a turn's end


@dataclass(slots=True)
class PauseDecode:
    """The decode (and maybe reply) started at a tentative end of `segment`."""

    segment: int
    end: int  # where the silence began
    energy: float
    task: asyncio.Task[AsrResult | VoxError]
    spoken: bool = False  # on_speculate was called with its text
    ended: bool = False  # the turn ended at this pause: its final takes the decode


class Speculation:
    """The speculation of one stream; each call is handed the stream (listen_state.py)."""

    def __init__(self) -> None:
        self.spec: PauseDecode | None = None
        self.end_of_turn: EndOfTurn | None = None  # semantic_vad only
        self._last_end: int | None = None  # where the last turn ended (history)

    def semantic(self, stream: ListenState, detection: TurnDetection | None) -> None:
        """The session's turn detection (again): semantic_vad or not, and its eagerness."""
        if detection is None or detection.type != "semantic_vad":
            self.end_of_turn = None
            stream.turns.semantic(None)
            return
        if self.end_of_turn is None:
            self.end_of_turn = EndOfTurn(detection.eagerness)
        self.end_of_turn.eagerness = detection.eagerness
        stream.turns.semantic(self.end_of_turn.longest_ms)

    def turn_starts(self, start: int) -> None:
        """Speech started at `start`: a new turn, nothing guessed about it yet."""
        if self.end_of_turn is not None and self._last_end is not None:
            self.end_of_turn.ended(start - self._last_end < EARLY_TURN_S * SAMPLE_RATE)
        self.spec = None

    def turn_ends(self, segment: int, end: SpeechEnd) -> asyncio.Task[AsrResult | VoxError] | None:
        """`segment` ended: the decode started at this very pause, for its final (None:
        there is none, and any other is cancelled)."""
        self._last_end = end.end
        spec, self.spec = self.spec, None
        if spec is not None and spec.segment == segment and spec.end == end.end:
            spec.ended = True
            return spec.task
        if spec is not None:
            spec.task.cancel()
        return None

    def pause(
        self,
        stream: ListenState,
        event: SpeechPause,
        group: asyncio.TaskGroup | None,
        later: Later,
        on_turn: OnTurn,
    ) -> None:
        """A tentative end: decode the turn so far now (its final, if the turn ends here);
        what it says is judged by `later`, in its place in the audio."""
        if group is None:
            return
        begin = max(event.start - stream.pad, stream.kept_from)
        audio = stream.audio.slice(begin, event.end + stream.pause_tail)
        energy = 1.0  # only semantic_vad reads it
        if self.end_of_turn is not None:
            energy = trailing_energy(audio[: max(event.end - begin, 0)], SAMPLE_RATE)
        task = group.create_task(self._decode(stream, audio), name="voxserve-asr-speculative")
        spec = self.spec = PauseDecode(stream.segment, event.end, energy, task)

        def back(done: asyncio.Task[AsrResult | VoxError]) -> None:
            if not done.cancelled() and not stream.closed:
                later(partial(self._speculated, stream, spec, on_turn))

        task.add_done_callback(back)

    async def _decode(self, stream: ListenState, audio: Int16Array) -> AsrResult | VoxError:
        """A final decode whose failure is a value (a task of the group must not raise)."""
        try:
            return await stream.recognise(audio, partial_result=False)
        except VoxError as exc:
            return exc

    async def _speculated(self, stream: ListenState, spec: PauseDecode, on_turn: OnTurn) -> None:
        """The decode at a pause is back: judge the turn's end by it (semantic_vad), and
        start the held-back reply if the turn is not over yet."""
        result = spec.task.result()
        if self.spec is not spec or spec.ended or isinstance(result, VoxError):
            return
        text = result.text.strip()
        if self.end_of_turn is not None:
            language = stream.language or result.language  # the session's, else detected
            wait = self.end_of_turn.wait_ms(
                text, spec.energy, language, result.stop_before_last_word
            )
            end = stream.turns.settle(spec.end, wait)
            if end is not None:
                await on_turn(end)
                return
        if stream.on_speculate is not None and text and stream.turns.silence_from == spec.end:
            spec.spoken = True
            await stream.on_speculate(spec.segment, text)

    async def resume(self, stream: ListenState) -> None:
        """The user went on after a pause: the speculative decode and reply are dropped."""
        spec, self.spec = self.spec, None
        if spec is None:
            return
        spec.task.cancel()
        stream.metrics.speculative_cancelled.inc()
        if spec.spoken and stream.on_resume is not None:
            await stream.on_resume(spec.segment)

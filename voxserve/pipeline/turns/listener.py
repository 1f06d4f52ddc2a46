"""The listening half of a session: ring -> VAD -> turns -> partial and final transcripts.

The receiver writes frames into the ring; once per batch of frames (not per frame) the
listener is enqueued on the generation's VAD batcher, whose round judges every due stream's
whole windows in one engine call and feeds the probabilities to the turn detector right there
(pipeline/scheduling/vad_batch.py). The listener's own task wakes only when that needs it: a turn
event to send, a mark to echo, the end of input. Partials re-decode the growing utterance (best
effort: skipped when the ASR stage is busy); finals are decoded in order by one worker per
session, so the recognizer state of one utterance (its audio) never mixes with the next or
with another stream's.

A conversation session (the Realtime API; `conversation` set) adds to that:
- each turn's audio is committed: `AudioCommitted` after its `VadEnd` (or, push-to-talk, at
  the client's commit), then `on_commit`, then its final (`TranscriptFinal`, or
  `TranscriptFailed` and `on_failed` when ASR fails), then `on_final`, even with no text;
- its VAD settings are its own (`TurnDetection`), and may change while it runs;
- with `turn_detection` None (push-to-talk) there is no VAD: the audio since the last
  commit accumulates until the client commits or clears it (`commit`, `clear`);
- the client's commit, clear and settings changes apply where they came in the audio: VAD
  judges no audio received after one before it has run (`_Control.exact`).

Speculation (every session with VAD): at a tentative end (`SpeechPause`, vad.speculate_ms
of silence) the final is decoded at once, on the audio up to where VAD heard the speech stop
(vad.pause_tail_ms more: Whisper fills trailing silence with made-up words); a turn that
ends there keeps that decode as its final unless sound follows the VAD's end within vad.pad_ms
(a stop's release after its closure, pipeline/turns/word_tail.py): then the final is decoded
again on the audio up to where that sound ends. With
semantic_vad its text decides how long the silence must last (pipeline/turns/endpointing.py), and
the turn's final reuses that decode; while
the turn is not confirmed `on_speculate` may start a held-back reply, and `on_resume`
withdraws it if the user goes on (voxserve_speculative_cancelled_total).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from voxserve.audio.pcm import Float32Array, Int16Array, to_float32
from voxserve.audio.ring import SampleRing
from voxserve.audio.stream_audio import StreamAudio
from voxserve.config import VadConfig
from voxserve.engines.base import inline_safe
from voxserve.engines.micro_wakeword import Detection
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import (
    AudioCleared,
    AudioCommitted,
    ConversationConfig,
    Mark,
    TranscriptFailed,
    TranscriptFinal,
    TranscriptPartial,
    TurnDetection,
    VadEnd,
    VadStart,
    WakeDetected,
    speech_item_id,
)
from voxserve.observe.tracing import TurnMarks
from voxserve.pipeline.context import SessionContext
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.scheduling.stage import deadline_in
from voxserve.pipeline.turns.detection import (
    SpeechEnd,
    SpeechPause,
    SpeechResume,
    SpeechStart,
    TurnDetector,
    TurnEvent,
    session_vad,
)
from voxserve.pipeline.turns.endpointing import EARLY_TURN_S, EndOfTurn, trailing_energy
from voxserve.pipeline.turns.wake_gate import WakeGate
from voxserve.pipeline.turns.word_tail import tail_sound_end
from voxserve.types import SAMPLE_RATE, AsrResult

log = logging.getLogger(__name__)

FINAL_QUEUE = 4  # utterances waiting for their final decode before the listener waits
KEPT_TURNS = 8  # segments whose vad.end time is kept for the final and turn latencies
# ASR stage deadlines (earliest-deadline-first admission, pipeline/scheduling/stage.py): someone is
# waiting on a final (the reply follows it); a partial is a preview that can wait longer.
# A final is due *out* 0.5 s after its endpoint: the ASR batcher waits for company only
# within that, less a batch's run time (pipeline/scheduling/batcher.py; docs/benchmarks.md).
FINAL_DUE_S = 0.5
PARTIAL_DUE_S = 1.5
_VAD, _TASK = "vad", "task"  # who holds a listener's stream state (Listener._holder)
# Push-to-talk: the least audio a commit takes (the Realtime API's own minimum); less is
# refused as empty_audio, and left in the buffer.
MIN_COMMIT_MS = 100


_Heard = TurnEvent | Detection  # what the task is handed: turns, and wake words heard


def ms(samples: int) -> int:
    return samples * 1000 // SAMPLE_RATE


def server_detection(vad: VadConfig) -> TurnDetection:
    """The turn detection of a /v1/stream or gRPC session that names none."""
    return TurnDetection(type=vad.turn_detection, eagerness=vad.eagerness)


@dataclass(frozen=True, slots=True)
class Utterance:
    segment: int
    start: int
    end: int
    audio: Int16Array
    decoded: asyncio.Task[AsrResult | VoxError] | None = None  # decoded at its pause


@dataclass(slots=True)
class _Speculation:
    """The decode (and maybe reply) started at a tentative end of `segment`."""

    segment: int
    end: int  # where the silence began
    energy: float
    task: asyncio.Task[AsrResult | VoxError]
    spoken: bool = False  # on_speculate was called with its text
    ended: bool = False  # the turn ended at this pause: its final takes the decode


@dataclass(frozen=True, slots=True)
class _Control:
    """Something the client asked at a point in its audio (a mark, a commit, ...): run by
    the task once the audio written before it has been read from the ring."""

    at: int  # ring.write_total when it came
    run: Callable[[], Awaitable[None]]
    # VAD reads no audio past `at` until it has run (a mark does not need to hold VAD back:
    # it only reports how far VAD got).
    exact: bool


class Listener:
    def __init__(
        self,
        ctx: SessionContext,
        ring: SampleRing,
        outbox: Outbox,
        *,
        language: str | None,
        partials: bool,
        partial_interval_ms: int,
        on_speech_start: Callable[[int], Awaitable[None]] | None = None,
        on_final: Callable[[int, str], Awaitable[None]] | None = None,
        conversation: ConversationConfig | None = None,
        session_id: str = "",
        wake_gate: WakeGate | None = None,
        turn_detection: TurnDetection | None = None,
    ) -> None:
        """`conversation`: a conversation session's (module docstring); `session_id` names
        its turns' items (speech_item_id); `wake_gate`: turns only after the session's wake
        word (pipeline/turns/wake_gate.py). `turn_detection`: a /v1/stream session's (None:
        the server's, vad.turn_detection)."""
        self.ctx = ctx
        self.ring = ring
        self.outbox = outbox
        self.language = language
        self.partials = partials
        settings = ctx.settings
        self.vad = ctx.engines.vad
        self.vad_state = self.vad.new_state()
        self.window = self.vad.window_samples
        if conversation is not None:
            detection = conversation.turn_detection
        else:
            detection = turn_detection or server_detection(settings.vad)
        vad = session_vad(settings.vad, detection)
        self.turns = TurnDetector(vad, self.window)
        self.turns.speculate = settings.vad.speculate_ms * SAMPLE_RATE // 1000
        self.end_of_turn: EndOfTurn | None = None
        self._semantic(detection)
        self._spec: _Speculation | None = None
        self._last_end: int | None = None  # where the last turn ended (history)
        # Assistant mode: (segment, text) a held-back reply to the turn not yet confirmed;
        # (segment) the user went on, withdraw it.
        self.on_speculate: Callable[[int, str], Awaitable[None]] | None = None
        self.on_resume: Callable[[int], Awaitable[None]] | None = None
        self.pad = vad.pad_ms * SAMPLE_RATE // 1000  # kept before speech start
        self.tail_pad = settings.vad.pad_ms * SAMPLE_RATE // 1000  # and after its end
        self.pause_tail = settings.vad.pause_tail_ms * SAMPLE_RATE // 1000  # at a pause
        self.in_conversation = conversation is not None
        self.wake_gate = wake_gate
        self.session_id = session_id
        # False: push-to-talk (a conversation without turn detection): no VAD at all.
        self.detecting = conversation is None or detection is not None
        self.min_commit = MIN_COMMIT_MS * SAMPLE_RATE // 1000
        # Audio before this is in no future turn: committed (push-to-talk) or cleared.
        self._kept_from = 0
        self.partial_every = partial_interval_ms * SAMPLE_RATE // 1000
        self.min_partial = settings.asr.min_partial_ms * SAMPLE_RATE // 1000
        self.audio = StreamAudio()
        self._leftover = np.zeros(0, dtype=np.float32)
        # The hooks of what follows the listener (Replies): awaited in the listener's task,
        # so a hook that waits holds up the turns after it.
        self.on_speech_start = on_speech_start  # (segment): vad.start (barge-in)
        # (segment, text) after the segment's transcript.final; /v1/stream: only when the
        # text is not empty; conversation sessions: every committed turn (its item is done).
        self.on_final = on_final
        # Conversation sessions only:
        # (segment, its speech in ms) after its AudioCommitted is queued, before its final
        # is decoded.
        self.on_commit: Callable[[int, int], Awaitable[None]] | None = None
        # (segment, error) after its TranscriptFailed is queued; on_final is not called.
        self.on_failed: Callable[[int, VoxError], Awaitable[None]] | None = None
        # The id of the conversation's last item: AudioCommitted's previous_item_id.
        self.last_item_id: Callable[[], str | None] | None = None
        self.wake = asyncio.Event()  # the task has work: `_inbox`, marks, end of input
        self.space = asyncio.Event()  # set whenever the listener frees ring space
        # Who may touch the ring, VAD and turn state now: the VAD batcher's round, this
        # listener's task, or nobody (None: waiting for audio).
        self._holder: str | None = None
        self._inbox: deque[list[_Heard] | BaseException] = deque()  # judged, for the task
        self._group: asyncio.TaskGroup | None = None
        self.task_wakeups = 0  # times the task had work (not once per batch: tests check)
        self.closed = False
        self.segment = -1
        self._finalized = -1
        self._last_partial_at = 0
        self._last_partial_text = ""
        self._partial_task: asyncio.Task[None] | None = None
        self._finals: asyncio.Queue[Utterance | None] = asyncio.Queue(FINAL_QUEUE)
        # pipeline.vad_batch_windows x 32 ms judged per wake-up: one VAD request per batch
        self.batch_samples = settings.pipeline.vad_batch_windows * self.window
        self._controls: deque[_Control] = deque()  # marks, commits, ...: in the client's order
        # Latency observations (voxserve.observe.metrics): perf_counter times of vad.start
        # (until the segment's first partial) and of vad.end per recent segment.
        self.metrics = ctx.metrics
        self._speech_started_at = 0.0
        self._partial_pending = False
        self._ended_at: dict[int, float] = {}
        # Per-turn span marks, only when tracing is on (ctx.tracer).
        self.tracing = ctx.tracer is not None
        self._turn_marks: dict[int, TurnMarks] = {}
        self.turn_done: Callable[[TurnMarks], None] | None = None  # asr mode: emit at final

    def release(self) -> None:
        """Drop the stream's audio now that its pipeline is over. A finished session can sit
        in a reference cycle until a full GC pass (rare under gc_control's thresholds); it
        should wait there as a few small objects, not with its utterance audio."""
        self.audio = StreamAudio()
        self._leftover = np.zeros(0, dtype=np.float32)
        self._ended_at.clear()
        self._turn_marks.clear()
        # The session's callbacks are its bound methods: without dropping them the pair is a
        # reference cycle, freed only by a full GC pass (soaks with session churn grew RSS).
        self.on_speech_start = self.on_final = self.turn_done = None
        self.on_speculate = self.on_resume = None
        self._spec = None
        self.on_commit = self.on_failed = self.last_item_id = None
        self._controls.clear()  # what they would run is bound to this listener
        self._group = None
        if self.wake_gate is not None:
            self.wake_gate.close()

    def close_input(self) -> None:
        self.closed = True
        self._kick()

    def poke(self) -> None:
        """Called by the receiver after each write (and when it waits for ring space): the
        stream goes to VAD once a batch of audio is waiting, not per frame."""
        if len(self.ring) >= self.batch_samples:
            self._kick()

    async def space_freed(self) -> None:
        """Until the listener next takes audio out of the ring (the receiver waits on it)."""
        self.space.clear()
        self.poke()
        await self.space.wait()

    def mark(self, mark_id: str | int, acked_seq: int | None = None) -> None:
        """Echo `mark_id` once every sample received before it has been through VAD: the
        client's measure of frame-handling lag, and its acknowledgement that audio up to
        `acked_seq` is processed (what a client keeps for resume can be trimmed)."""
        echo = partial(self.outbox.event, Mark(id=mark_id, acked_seq=acked_seq))
        self._controls.append(_Control(self.ring.write_total, echo, exact=False))
        self._kick()

    # -- conversation sessions: the client's turn controls -------------------------------

    def commit(self) -> asyncio.Future[int | None]:
        """The audio received until now is a turn: push-to-talk, the audio since the last
        commit (refused with empty_audio under MIN_COMMIT_MS); server VAD, the turn in
        progress ends now (refused when no speech is in progress). The future is the turn's
        segment once it is committed (after `on_commit`), None if it is refused: a
        `response.create` sent right after the commit answers that turn (Responses)."""
        turn: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._control(partial(self._commit, turn))
        return turn

    def clear(self) -> None:
        """Drop the audio received until now that no turn has taken (AudioCleared): with
        server VAD, the turn in progress too (it gets no vad.end, no final)."""
        self._control(self._clear)

    def set_turn_detection(self, detection: TurnDetection | None) -> None:
        """New turn detection from this point of the audio on. Switching VAD off ends the
        turn in progress as its silence would (vad.end, committed, final); switching it on
        judges the audio not yet committed, as if VAD had been on."""
        self._control(partial(self._detect, detection))

    def _control(self, run: Callable[[], Awaitable[None]]) -> None:
        self._controls.append(_Control(self.ring.write_total, run, exact=True))
        self._kick()

    def _kick(self) -> None:
        """Hand the stream to whoever has work for it, unless someone already has it: to the
        VAD batcher when audio is due (a whole batch, or any audio before a mark or the end
        of input), else to the task for marks already judged or the end of input."""
        if self._holder is not None:
            return
        queued = len(self.ring)
        if queued >= self.batch_samples or (queued and (self.closed or self._controls)):
            self._holder = _VAD
            self.ctx.vad_batcher().enqueue(self)
        elif self.closed or self._control_due():
            self._give_task(None)

    def _control_due(self) -> bool:
        return bool(self._controls) and self._controls[0].at <= self.ring.read_total

    def _read_limit(self) -> int | None:
        """How much of the ring VAD may read: up to the first exact control."""
        for control in self._controls:  # usually none
            if control.exact:
                return max(0, control.at - self.ring.read_total)
        return None

    def _give_task(self, item: list[_Heard] | BaseException | None) -> None:
        if item is not None:
            self._inbox.append(item)
        self._holder = _TASK
        self.wake.set()

    def vad_input(self) -> tuple[object, Float32Array] | None:
        """VadJob: everything in the ring (up to an exact control), as whole 32 ms windows
        (the rest waits for more). Push-to-talk: the audio is only kept, never judged."""
        samples = self.ring.read(self._read_limit() if self._controls else None)
        self.space.set()
        if not samples.size:
            return None
        self.audio.append(samples)
        if self.wake_gate is not None:
            self.wake_gate.feed(samples)
        if not self.detecting:
            return None
        audio = to_float32(samples)
        if self._leftover.size:
            audio = np.concatenate((self._leftover, audio))
        usable = audio.size - audio.size % self.window
        self._leftover = audio[usable:]
        return (self.vad_state, audio[:usable]) if usable else None

    def vad_result(self, probs: Float32Array | None, error: BaseException | None) -> None:
        """VadJob, in the batcher's round: turns are detected here; the task is woken only
        for what needs it (events to send, marks, end of input, an error)."""
        self._holder = None
        if error is not None:
            self._give_task(error)
            return
        try:
            if not self.detecting and self._push_to_talk_full():
                # Bounded as a VAD turn is (vad.max_utterance_s): committed as a turn.
                full = SpeechEnd(self._kept_from, self.audio.end, forced=True)
                self._give_task([full])
                return
            events = self._feed_turns(probs) if probs is not None else []
            if events or self.closed or self._control_due() or self._group is None:
                self._give_task(events if probs is not None else None)  # None: nothing judged
                return
            if probs is not None:
                self._after_judge(self._group)
        except Exception as exc:  # this stream's failure, not the round's
            self._give_task(exc)
            return
        self._kick()

    def _feed_turns(self, probs: Float32Array) -> list[_Heard]:
        """New VAD probabilities to the turn detector; behind a wake word, what the gate lets
        through, after the detections it heard (wake_gate.py)."""
        gate = self.wake_gate
        if gate is None:
            return list(self.turns.feed(probs.tolist()))
        heard: list[_Heard] = list(gate.take_heard())
        turns = self.turns.feed(gate.mask(probs, self.turns.position, self.window).tolist())
        ended = any(isinstance(event, SpeechEnd) for event in turns)
        gate.after_turns(self.turns.position, self.turns.speaking, ended)
        return heard + turns

    def _push_to_talk_full(self) -> bool:
        return self.audio.end - self._kept_from >= self.turns.max_utterance

    async def _run_controls(self) -> None:
        controls, done = self._controls, self.ring.read_total
        while controls and controls[0].at <= done:
            await controls.popleft().run()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            self._group = group
            group.create_task(self._final_worker(), name="voxserve-asr-final")
            self._kick()
            while True:
                await self.wake.wait()
                self.wake.clear()
                if self._holder is not _TASK:
                    continue
                self.task_wakeups += 1
                while self._inbox:
                    item = self._inbox.popleft()
                    if isinstance(item, BaseException):
                        raise item
                    for event in item:
                        await self._on_turn(event)
                    self._after_judge(group)
                await self._run_controls()
                self._holder = None
                if self.closed and not len(self.ring):
                    break
                self._kick()
            await self._flush(group)

    async def _judge(self, audio: Float32Array, group: asyncio.TaskGroup) -> None:
        """Audio judged on its own: the last partial window at the end of input, or what
        push-to-talk kept when turn detection comes back on (whole windows)."""
        probs = await self.ctx.vad_batcher().speech_probs(self.vad_state, audio)
        for event in self._feed_turns(probs):
            await self._on_turn(event)
        self._after_judge(group)

    def _after_judge(self, group: asyncio.TaskGroup) -> None:
        """After new probabilities: a partial while speaking, else drop audio no turn needs."""
        if not self.detecting:
            return  # push-to-talk: the audio waits for the client's commit
        if self.turns.speaking:
            if not self.turns.trailing_silence:  # a partial of the hangover adds nothing
                self._maybe_partial(group)
        else:
            self.audio.trim(self.turns.position - self.pad)

    async def _flush(self, group: asyncio.TaskGroup) -> None:
        """End of input: the turn in progress ends (push-to-talk: the audio not committed is
        committed, unless under MIN_COMMIT_MS), then the finals worker."""
        if not self.detecting:
            if self.audio.end - self._kept_from >= self.min_commit:
                await self._on_turn(SpeechEnd(self._kept_from, self.audio.end, forced=True))
            await self._finals.put(None)
            return
        if self._leftover.size:
            padded = np.zeros(self.window, dtype=np.float32)
            padded[: self._leftover.size] = self._leftover
            self._leftover = np.zeros(0, dtype=np.float32)
            await self._judge(padded, group)
        for event in self.turns.flush():
            await self._on_turn(event)
        await self._finals.put(None)

    def _semantic(self, detection: TurnDetection | None) -> None:
        if detection is None or detection.type != "semantic_vad":
            self.end_of_turn = None
            self.turns.semantic(None)
            return
        if self.end_of_turn is None:
            self.end_of_turn = EndOfTurn(detection.eagerness)
        self.end_of_turn.eagerness = detection.eagerness
        self.turns.semantic(self.end_of_turn.longest_ms)

    def _pause(self, event: SpeechPause) -> None:
        """A tentative end: decode the turn so far now (its final, if the turn ends here)."""
        if self._group is None:
            return
        begin = max(event.start - self.pad, self._kept_from)
        audio = self.audio.slice(begin, event.end + self.pause_tail)
        energy = 1.0  # only semantic_vad reads it
        if self.end_of_turn is not None:
            energy = trailing_energy(audio[: max(event.end - begin, 0)], SAMPLE_RATE)
        task = self._group.create_task(self._decode(audio), name="voxserve-asr-speculative")
        spec = self._spec = _Speculation(self.segment, event.end, energy, task)

        def back(done: asyncio.Task[AsrResult | VoxError]) -> None:
            if not done.cancelled() and not self.closed:
                self._control(partial(self._speculated, spec))

        task.add_done_callback(back)

    async def _decode(self, audio: Int16Array) -> AsrResult | VoxError:
        """A final decode whose failure is a value (a task of the group must not raise)."""
        try:
            return await self._recognise(audio, partial_result=False)
        except VoxError as exc:
            return exc

    async def _speculated(self, spec: _Speculation) -> None:
        """The decode at a pause is back: judge the turn's end by it (semantic_vad), and
        start the held-back reply if the turn is not over yet."""
        result = spec.task.result()
        if self._spec is not spec or spec.ended or isinstance(result, VoxError):
            return
        text = result.text.strip()
        if self.end_of_turn is not None:
            language = self.language or result.language  # the session's, else detected
            wait = self.end_of_turn.wait_ms(text, spec.energy, language)
            end = self.turns.settle(spec.end, wait)
            if end is not None:
                await self._on_turn(end)
                return
        if self.on_speculate is not None and text and self.turns.silence_from == spec.end:
            spec.spoken = True
            await self.on_speculate(spec.segment, text)

    async def _resume(self) -> None:
        """The user went on after a pause: the speculative decode and reply are dropped."""
        spec, self._spec = self._spec, None
        if spec is None:
            return
        spec.task.cancel()
        self.metrics.speculative_cancelled.inc()
        if spec.spoken and self.on_resume is not None:
            await self.on_resume(spec.segment)

    async def _on_turn(self, event: _Heard) -> None:
        if isinstance(event, Detection):  # the wake word: the command's audio starts here
            self._kept_from = max(self._kept_from, event.sample)
            await self.outbox.event(WakeDetected(name=event.name, timestamp_ms=event.timestamp_ms))
            return
        if isinstance(event, SpeechPause):
            self._pause(event)
            return
        if isinstance(event, SpeechResume):
            await self._resume()
            return
        if isinstance(event, SpeechStart):
            if self.end_of_turn is not None and self._last_end is not None:
                self.end_of_turn.ended(event.start - self._last_end < EARLY_TURN_S * SAMPLE_RATE)
            self._spec = None
            self.segment += 1
            self._last_partial_at = event.start
            self._last_partial_text = ""
            await self.outbox.event(VadStart(segment=self.segment, start_ms=ms(event.start)))
            self._speech_started_at = time.perf_counter()
            self._partial_pending = True
            if self.tracing:
                turn = self._turn_marks[self.segment] = TurnMarks(self.segment)
                turn.mark("vad.start")
            if self.on_speech_start is not None:
                await self.on_speech_start(self.segment)
            return
        assert isinstance(event, SpeechEnd)
        self._last_end = event.end
        if self.wake_gate is not None:  # one command per word, whoever ended the turn
            self.wake_gate.turn_ended(event.end)
        decoded = None
        spec, self._spec = self._spec, None
        if spec is not None and spec.segment == self.segment and spec.end == event.end:
            spec.ended = True
            decoded = spec.task
        elif spec is not None:
            spec.task.cancel()
        if self.detecting:
            await self.outbox.event(
                VadEnd(segment=self.segment, start_ms=ms(event.start), end_ms=ms(event.end))
            )
            begin = max(event.start - self.pad, self._kept_from)
            audio = self.audio.slice(begin, event.end + self.tail_pad)
            if decoded is not None:
                paused_at = event.end + self.pause_tail - max(begin, self.audio.start)
                heard = tail_sound_end(audio, paused_at, SAMPLE_RATE)
                if heard is not None:  # the last word went on past the pause's decode
                    decoded.cancel()  # (done by now, mostly: then a no-op)
                    decoded, audio = None, audio[:heard]
        else:  # push-to-talk: the audio since the last commit, no VAD, no vad.* events
            self.segment += 1
            audio = self.audio.slice(event.start, event.end)
            self._kept_from = event.end
            self.audio.trim(event.end)
        self._ended_at[self.segment] = time.perf_counter()
        self._ended_at.pop(self.segment - KEPT_TURNS, None)
        if self.tracing and self.segment in self._turn_marks:
            self._turn_marks[self.segment].mark("vad.end")
        if self.in_conversation:
            await self._committed(self.segment, ms(event.end) - ms(event.start))
        await self._finals.put(Utterance(self.segment, event.start, event.end, audio, decoded))

    def item_id(self, segment: int) -> str:
        """The conversation item of `segment`'s turn."""
        return speech_item_id(self.session_id, segment)

    async def _committed(self, segment: int, audio_ms: int) -> None:
        previous = self.last_item_id() if self.last_item_id is not None else None
        item_id = self.item_id(segment)
        await self.outbox.event(
            AudioCommitted(segment=segment, item_id=item_id, previous_item_id=previous)
        )
        if self.on_commit is not None:
            await self.on_commit(segment, audio_ms)

    async def _refuse_commit(self, why: str) -> None:
        """An empty commit: told, nothing committed, the buffer as it was."""
        await self.outbox.event(VoxError(ErrorCode.EMPTY_AUDIO, why).to_event())

    async def _commit(self, turn: asyncio.Future[int | None]) -> None:
        segment: int | None = None
        try:
            if self.detecting:
                event = self.turns.cut()
                if event is None:
                    await self._refuse_commit("no speech in progress to commit")
                    return
                await self._on_turn(event)
                segment = self.segment
                return
            held = self.audio.end - self._kept_from
            if held < self.min_commit:
                await self._refuse_commit(
                    f"no audio to commit: {ms(held)} ms buffered, at least {MIN_COMMIT_MS} ms"
                    " needed"
                )
                return
            await self._on_turn(SpeechEnd(self._kept_from, self.audio.end, forced=True))
            segment = self.segment
        finally:
            if not turn.done():  # the session may have given up on it (Responses.wait)
                turn.set_result(segment)

    async def _clear(self) -> None:
        if self.detecting:
            if self.turns.speaking:  # dropped: none of its partials is sent from now on
                self._finalized = max(self._finalized, self.segment)
            self.turns.drop()
        self._kept_from = self.audio.end
        self.audio.trim(self.audio.end)
        await self.outbox.event(AudioCleared())

    async def _detect(self, detection: TurnDetection | None) -> None:
        vad = session_vad(self.ctx.settings.vad, detection)
        self.turns.tune(vad)
        self._semantic(detection)
        self.pad = vad.pad_ms * SAMPLE_RATE // 1000
        if (detection is not None) == self.detecting:
            return
        self._leftover = np.zeros(0, dtype=np.float32)  # its samples are in self.audio
        if detection is None:  # to push-to-talk: the turn in progress ends, as at silence
            candidate = self.turns.candidate_start
            end = self.turns.cut()
            if end is not None:
                await self._on_turn(end)
            keep = end.end if end is not None else candidate
            self._kept_from = max(self._kept_from, self.turns.position if keep is None else keep)
            self.turns.drop()
            self.detecting = False
            return
        # To server VAD: the audio not committed is judged now, as if VAD had been on.
        self.detecting = True
        self.vad_state = self.vad.new_state()
        self.turns.restart_at(self._kept_from)
        held = to_float32(self.audio.slice(self._kept_from, self.audio.end))
        usable = held.size - held.size % self.window
        self._leftover = held[usable:]
        if usable and self._group is not None:
            await self._judge(held[:usable], self._group)

    def speech_ended_at(self, segment: int) -> float | None:
        """perf_counter time vad.end of `segment` was sent (recent segments only)."""
        return self._ended_at.get(segment)

    def take_turn(self, segment: int) -> TurnMarks | None:
        """The span marks of `segment` (tracing on), for the reply to complete and emit."""
        return self._turn_marks.pop(segment, None)

    def _final_marked(self, segment: int, *, spoken: bool) -> None:
        turn = self._turn_marks.get(segment)
        if turn is None:
            return
        turn.mark("asr.final")
        for old in [s for s in self._turn_marks if s < segment - KEPT_TURNS]:
            del self._turn_marks[old]
        if self.on_final is None or not spoken:  # no reply follows: the turn ends here
            del self._turn_marks[segment]
            if self.turn_done is not None:
                self.turn_done(turn)

    def _maybe_partial(self, group: asyncio.TaskGroup) -> None:
        start = self.turns.speech_start
        now = self.turns.position
        if not self.partials or start is None or now - start < self.min_partial:
            return
        if now - self._last_partial_at < self.partial_every:
            return
        if self._partial_task is not None and not self._partial_task.done():
            return
        stage = self.ctx.stages.stage("asr")
        if stage.live_waiting or stage.bulk_short:
            return  # best effort: never queue behind finals, nor take bulk's share of slots
        self._last_partial_at = now
        audio = self.audio.slice(max(start - self.pad, self._kept_from), now)
        self._partial_task = group.create_task(
            self._partial(self.segment, start, now, audio), name="voxserve-asr-partial"
        )

    async def _partial(self, segment: int, start: int, end: int, audio: Int16Array) -> None:
        try:
            result = await self._recognise(audio, partial_result=True)
        except VoxError as exc:
            log.debug("partial skipped", extra={"code": exc.code.value})
            return
        if segment <= self._finalized or segment != self.segment:
            return  # the final for this segment is out (or on its way): never send after it
        text = result.text.strip()
        if text and text != self._last_partial_text:
            self._last_partial_text = text
            if self._partial_pending:
                self._partial_pending = False
                self.metrics.observe_first_partial(time.perf_counter() - self._speech_started_at)
            await self.outbox.event(
                TranscriptPartial(segment=segment, text=text, start_ms=ms(start), end_ms=ms(end))
            )

    async def _recognise(self, audio: Int16Array, *, partial_result: bool) -> AsrResult:
        batcher = None if partial_result else self.ctx.asr_batcher()
        if batcher is not None:
            return await batcher.final(
                to_float32(audio), self.language, deadline=deadline_in(FINAL_DUE_S)
            )
        stage = self.ctx.stages.stage("asr")
        asr = self.ctx.engines.asr
        call = partial(
            asr.transcribe,
            to_float32(audio),
            language=self.language,
            partial=partial_result,
        )
        due = deadline_in(PARTIAL_DUE_S if partial_result else FINAL_DUE_S)
        result: AsrResult = await stage.run(call, deadline=due, inline_ok=inline_safe(asr))
        return result

    async def _final_worker(self) -> None:
        while (utterance := await self._finals.get()) is not None:
            self._finalized = max(self._finalized, utterance.segment)
            try:
                decoded = await utterance.decoded if utterance.decoded is not None else None
                if isinstance(decoded, AsrResult):  # decoded at the pause that ended it
                    result = decoded
                else:  # none, or it failed then (busy, ...): the turn's own decode, as ever
                    result = await self._recognise(utterance.audio, partial_result=False)
            except VoxError as exc:
                await self._failed(utterance.segment, exc)
                continue
            text = result.text.strip()
            await self.outbox.event(
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
                self.metrics.observe_final(time.perf_counter() - ended)
            if self.tracing:
                self._final_marked(utterance.segment, spoken=bool(text))
            if self.on_final is not None and (text or self.in_conversation):
                await self.on_final(utterance.segment, text)

    async def _failed(self, segment: int, error: VoxError) -> None:
        """A final that could not be decoded: an error event (/v1/stream), or the turn's
        TranscriptFailed and `on_failed` (conversation sessions)."""
        if not self.in_conversation:
            await self.outbox.event(error.to_event(segment=segment))
            return
        await self.outbox.event(
            TranscriptFailed(
                segment=segment,
                item_id=self.item_id(segment),
                code=error.code.value,
                message=error.message,
            )
        )
        if self.on_failed is not None:
            await self.on_failed(segment, error)

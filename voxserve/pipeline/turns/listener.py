"""The listening half of a session: ring -> VAD -> turns -> partial and final transcripts.

The receiver writes frames into the ring; once per batch of frames (not per frame) the
listener is enqueued on the generation's VAD batcher, whose round judges every due stream's
whole windows in one engine call and feeds the probabilities to the turn detector right there
(pipeline/scheduling/vad_batch.py). The listener's own task wakes only when that needs it: a
turn event to send, a mark to echo, the end of input.

This module is that hand-off (who may touch the stream now: the batcher's round, the task,
or nobody) and the task that handles each turn event in order; the rest is in parts of its
own, each handed the stream's state (listen_state.py):
- partials.py: the growing utterance re-decoded now and then (best effort);
- finals.py: each ended turn decoded in order, by one worker per session;
- speculation.py: the final decoded at a pause, semantic_vad's end of turn, held-back replies;
- commits.py: a conversation session's commits, and the client's commit and clear;
- vad_windows.py: the audio framed in whole windows for the VAD engine;
- controls.py: the client's marks, commits, ... kept in their place in the audio.

A conversation session (the Realtime API; `conversation` set): its turns are committed
(commits.py); its VAD settings are its own (`TurnDetection`), and may change while it runs;
with `turn_detection` None (push-to-talk) there is no VAD. The client's commit, clear and
settings changes apply where they came in the audio: VAD judges no audio received after one
before it has run (controls.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial

from voxserve.audio.pcm import Float32Array
from voxserve.audio.ring import SampleRing
from voxserve.audio.stream_audio import StreamAudio
from voxserve.engines.micro_wakeword import Detection
from voxserve.events import (
    ConversationConfig,
    Mark,
    TurnDetection,
    VadEnd,
    VadStart,
    WakeDetected,
)
from voxserve.observe.tracing import TurnMarks
from voxserve.pipeline.context import SessionContext
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.turns import commits
from voxserve.pipeline.turns.controls import Controls
from voxserve.pipeline.turns.detection import (
    SpeechEnd,
    SpeechPause,
    SpeechResume,
    SpeechStart,
    session_vad,
)
from voxserve.pipeline.turns.finals import Finals, Utterance
from voxserve.pipeline.turns.listen_state import Heard, ListenState, ms, server_detection
from voxserve.pipeline.turns.partials import Partials
from voxserve.pipeline.turns.speculation import Speculation
from voxserve.pipeline.turns.vad_windows import VadWindows
from voxserve.pipeline.turns.wake_gate import WakeGate
from voxserve.pipeline.turns.word_tail import tail_sound_end
from voxserve.types import SAMPLE_RATE

_VAD, _TASK = "vad", "task"  # who holds a listener's stream state (Listener._holder)


class Listener(ListenState):
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
        settings = ctx.settings
        self.vad_windows = VadWindows(ctx.engines.vad)
        if conversation is not None:
            detection = conversation.turn_detection
        else:
            detection = turn_detection or server_detection(settings.vad)
        super().__init__(
            ctx,
            ring,
            outbox,
            language=language,
            partials=partials,
            partial_interval_ms=partial_interval_ms,
            conversation=conversation,
            detection=detection,
            session_id=session_id,
            wake_gate=wake_gate,
        )
        self.speculation = Speculation()
        self.speculation.semantic(self, detection)
        self.partial_decoder = Partials(settings.asr.min_partial_ms, settings.asr.partial_max_speed)
        self.finals = Finals()
        self.on_speech_start = on_speech_start  # (segment): vad.start (barge-in)
        self.on_final = on_final
        self.wake = asyncio.Event()  # the task has work: `_inbox`, marks, end of input
        self.space = asyncio.Event()  # set whenever the listener frees ring space
        # Who may touch the ring, VAD and turn state now: the VAD batcher's round, this
        # listener's task, or nobody (None: waiting for audio).
        self._holder: str | None = None
        self._inbox: deque[list[Heard] | BaseException] = deque()  # judged, for the task
        self._group: asyncio.TaskGroup | None = None
        self.task_wakeups = 0  # times the task had work (not once per batch: tests check)
        # pipeline.vad_batch_windows x 32 ms judged per wake-up: one VAD request per batch;
        # pipeline.vad_turn_windows while a turn that is answered is in progress
        windows = settings.pipeline.vad_batch_windows
        self.credit_samples = windows * self.window  # the credit window's unit (audio_input)
        self._turn_samples = min(settings.pipeline.vad_turn_windows, windows) * self.window
        self._controls = Controls()  # marks, commits, ...: in the client's order

    @property
    def batch_samples(self) -> int:
        """The audio that wakes the listener: fewer windows while a turn is in progress that
        a reply follows (its end is the reply's start), else pipeline.vad_batch_windows."""
        if self.turns.speaking and (self.on_speculate is not None or self.on_commit is not None):
            return self._turn_samples
        return self.credit_samples

    def release(self) -> None:
        """Drop the stream's audio now that its pipeline is over. A finished session can sit
        in a reference cycle until a full GC pass (rare under gc_control's thresholds); it
        should wait there as a few small objects, not with its utterance audio."""
        self.audio = StreamAudio()
        self.vad_windows.drop()
        self.finals.release()
        self.drop_hooks()
        self.speculation.spec = None
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
        self._controls.add(self.ring.write_total, echo, exact=False)
        self._kick()

    def speech_ended_at(self, segment: int) -> float | None:
        """perf_counter time vad.end of `segment` was sent (recent segments only)."""
        return self.finals.speech_ended_at(segment)

    def take_turn(self, segment: int) -> TurnMarks | None:
        """The span marks of `segment` (tracing on), for the reply to complete and emit."""
        return self.finals.take_turn(segment)

    # -- conversation sessions: the client's turn controls (commits.py) -----------------

    def commit(self) -> asyncio.Future[int | None]:
        """The audio received until now is a turn: push-to-talk, the audio since the last
        commit (refused with empty_audio under MIN_COMMIT_MS); server VAD, the turn in
        progress ends now (refused when no speech is in progress). The future is the turn's
        segment once it is committed (after `on_commit`), None if it is refused: a
        `response.create` sent right after the commit answers that turn (Responses)."""
        turn: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._control(partial(commits.commit, self, turn, self._on_turn))
        return turn

    def clear(self) -> None:
        """Drop the audio received until now that no turn has taken (AudioCleared): with
        server VAD, the turn in progress too (it gets no vad.end, no final)."""
        self._control(partial(commits.clear, self))

    def set_turn_detection(self, detection: TurnDetection | None) -> None:
        """New turn detection from this point of the audio on. Switching VAD off ends the
        turn in progress as its silence would (vad.end, committed, final); switching it on
        judges the audio not yet committed, as if VAD had been on."""
        self._control(partial(self._detect, detection))

    # -- the hand-off: the VAD batcher's round, or this listener's task ------------------

    def _control(self, run: Callable[[], Awaitable[None]]) -> None:
        self._controls.add(self.ring.write_total, run, exact=True)
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
        return self._controls.due(self.ring.read_total)

    def _give_task(self, item: list[Heard] | BaseException | None) -> None:
        if item is not None:
            self._inbox.append(item)
        self._holder = _TASK
        self.wake.set()

    def vad_input(self) -> tuple[object, Float32Array] | None:
        """VadJob: everything in the ring (up to an exact control), as whole 32 ms windows
        (the rest waits for more). Push-to-talk: the audio is only kept, never judged."""
        samples = self.ring.read(
            self._controls.read_limit(self.ring.read_total) if self._controls else None
        )
        self.space.set()
        if not samples.size:
            return None
        self.audio.append(samples)
        if self.wake_gate is not None:
            self.wake_gate.feed(samples)
        if not self.detecting:
            return None
        windows = self.vad_windows.take(samples)
        return (self.vad_windows.state, windows) if windows is not None else None

    def vad_result(self, probs: Float32Array | None, error: BaseException | None) -> None:
        """VadJob, in the batcher's round: turns are detected here; the task is woken only
        for what needs it (events to send, marks, end of input, an error)."""
        self._holder = None
        if error is not None:
            self._give_task(error)
            return
        try:
            if not self.detecting and commits.push_to_talk_full(self):
                # Bounded as a VAD turn is (vad.max_utterance_s): committed as a turn.
                self._give_task([commits.whole_turn(self)])
                return
            events = self.feed_turns(probs) if probs is not None else []
            if events or self.closed or self._control_due() or self._group is None:
                self._give_task(events if probs is not None else None)  # None: nothing judged
                return
            if probs is not None:
                self._after_judge(self._group)
        except Exception as exc:  # this stream's failure, not the round's
            self._give_task(exc)
            return
        self._kick()

    # -- the task: each turn event in order --------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            self._group = group
            group.create_task(self.finals.worker(self), name="voxserve-asr-final")
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
                await self._controls.run_due(self.ring.read_total)
                self._holder = None
                if self.closed and not len(self.ring):
                    break
                self._kick()
            await self._flush(group)

    async def _judge(self, audio: Float32Array, group: asyncio.TaskGroup) -> None:
        """Audio judged on its own: the last partial window at the end of input, or what
        push-to-talk kept when turn detection comes back on (whole windows)."""
        probs = await self.ctx.vad_batcher().speech_probs(self.vad_windows.state, audio)
        for event in self.feed_turns(probs):
            await self._on_turn(event)
        self._after_judge(group)

    def _after_judge(self, group: asyncio.TaskGroup) -> None:
        """After new probabilities: a partial while speaking, else drop audio no turn needs."""
        if not self.detecting:
            return  # push-to-talk: the audio waits for the client's commit
        if self.turns.speaking:
            if not self.turns.trailing_silence:  # a partial of the hangover adds nothing
                self.partial_decoder.maybe(self, group)
        else:
            self.audio.trim(self.turns.position - self.pad)

    async def _flush(self, group: asyncio.TaskGroup) -> None:
        """End of input: the turn in progress ends (push-to-talk: the audio not committed is
        committed, unless under MIN_COMMIT_MS), then the finals worker."""
        if not self.detecting:
            if commits.held(self) >= commits.MIN_COMMIT:
                await self._on_turn(commits.whole_turn(self))
            await self.finals.put(None)
            return
        last = self.vad_windows.last()
        if last is not None:
            await self._judge(last, group)
        for event in self.turns.flush():
            await self._on_turn(event)
        await self.finals.put(None)

    async def _detect(self, detection: TurnDetection | None) -> None:
        vad = session_vad(self.ctx.settings.vad, detection)
        self.turns.tune(vad)
        self.speculation.semantic(self, detection)
        self.pad = vad.pad_ms * SAMPLE_RATE // 1000
        if (detection is not None) == self.detecting:
            return
        self.vad_windows.drop()  # its samples are in self.audio
        if detection is None:  # to push-to-talk: the turn in progress ends, as at silence
            candidate = self.turns.candidate_start
            end = self.turns.cut()
            if end is not None:
                await self._on_turn(end)
            keep = end.end if end is not None else candidate
            self.kept_from = max(self.kept_from, self.turns.position if keep is None else keep)
            self.turns.drop()
            self.detecting = False
            return
        # To server VAD: the audio not committed is judged now, as if VAD had been on.
        self.detecting = True
        self.turns.restart_at(self.kept_from)
        whole = self.vad_windows.restart(self.audio.slice(self.kept_from, self.audio.end))
        if whole.size and self._group is not None:
            await self._judge(whole, self._group)

    async def _on_turn(self, event: Heard) -> None:
        if isinstance(event, Detection):  # the wake word: the command's audio starts here
            self.kept_from = max(self.kept_from, event.sample)
            await self.outbox.event(WakeDetected(name=event.name, timestamp_ms=event.timestamp_ms))
            return
        if isinstance(event, SpeechPause):
            self.speculation.pause(self, event, self._group, self._control, self._on_turn)
            return
        if isinstance(event, SpeechResume):
            await self.speculation.resume(self)
            return
        if isinstance(event, SpeechStart):
            self.speculation.turn_starts(event.start)
            self.segment += 1
            self.partial_decoder.turn_starts(event.start, self.turns.position, self.input_held)
            await self.outbox.event(VadStart(segment=self.segment, start_ms=ms(event.start)))
            self.partial_decoder.speech_started()
            self.finals.turn_started(self)
            if self.on_speech_start is not None:
                await self.on_speech_start(self.segment)
            return
        assert isinstance(event, SpeechEnd)
        if self.wake_gate is not None:  # one command per word, whoever ended the turn
            self.wake_gate.turn_ended(event.end)
        decoded = self.speculation.turn_ends(self.segment, event)
        if self.detecting:
            await self.outbox.event(
                VadEnd(segment=self.segment, start_ms=ms(event.start), end_ms=ms(event.end))
            )
            begin = max(event.start - self.pad, self.kept_from)
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
            self.kept_from = event.end
            self.audio.trim(event.end)
        self.finals.turn_ended(self.segment)
        if self.in_conversation:
            await commits.committed(self, self.segment, ms(event.end) - ms(event.start))
        await self.finals.put(Utterance(self.segment, event.start, event.end, audio, decoded))

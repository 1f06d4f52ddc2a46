"""What a listener's parts share: one stream's audio, its turn detector, where its turns are.

The listener (listener.py) is this state plus the parts that act on it, each a module of its
own: partials.py, speculation.py, finals.py, commits.py. A part keeps only its own fields and
is handed this state at each call rather than holding it: the listener holds its parts, and a
part holding the listener back would make every finished listener a reference cycle, freed
only by a full GC pass (Listener.release). The parts import this module, never each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

from voxserve.audio.pcm import Float32Array, Int16Array, to_float32
from voxserve.audio.ring import SampleRing
from voxserve.audio.stream_audio import StreamAudio
from voxserve.config import VadConfig
from voxserve.engines.base import inline_safe
from voxserve.engines.micro_wakeword import Detection
from voxserve.errors import VoxError
from voxserve.events import ConversationConfig, TurnDetection, speech_item_id
from voxserve.observe.tracing import TurnMarks
from voxserve.pipeline.context import SessionContext
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.scheduling.credit import CreditWindow
from voxserve.pipeline.scheduling.stage import deadline_in
from voxserve.pipeline.turns.detection import SpeechEnd, TurnDetector, TurnEvent, session_vad
from voxserve.pipeline.turns.wake_gate import WakeGate
from voxserve.types import SAMPLE_RATE, AsrResult

# ASR stage deadlines (earliest-deadline-first admission, pipeline/scheduling/stage.py): someone is
# waiting on a final (the reply follows it); a partial is a preview that can wait longer.
# A final is due *out* 0.5 s after its endpoint: the ASR batcher waits for company only
# within that, less a batch's run time (pipeline/scheduling/batcher.py; docs/benchmarks.md).
FINAL_DUE_S = 0.5
PARTIAL_DUE_S = 1.5

Heard = TurnEvent | Detection  # what the listener's task is handed: turns, wake words heard


def ms(samples: int) -> int:
    return samples * 1000 // SAMPLE_RATE


def server_detection(vad: VadConfig) -> TurnDetection:
    """The turn detection of a /v1/stream or gRPC session that names none."""
    return TurnDetection(type=vad.turn_detection, eagerness=vad.eagerness)


class ListenState:
    def __init__(
        self,
        ctx: SessionContext,
        ring: SampleRing,
        outbox: Outbox,
        *,
        language: str | None,
        partials: bool,
        partial_interval_ms: int,
        conversation: ConversationConfig | None,
        detection: TurnDetection | None,
        session_id: str,
        wake_gate: WakeGate | None,
    ) -> None:
        """`detection`: the session's turn detection, resolved (Listener); None with a
        conversation: push-to-talk."""
        self.ctx = ctx
        self.ring = ring
        self.outbox = outbox
        self.stream_window: CreditWindow | None = None  # the session's input window (wiring)
        self.language = language
        self.partials = partials
        settings = ctx.settings
        self.window = ctx.engines.vad.window_samples
        vad = session_vad(settings.vad, detection)
        self.turns = TurnDetector(vad, self.window)
        self.turns.speculate = settings.vad.speculate_ms * SAMPLE_RATE // 1000
        self.pad = vad.pad_ms * SAMPLE_RATE // 1000  # kept before speech start
        self.tail_pad = settings.vad.pad_ms * SAMPLE_RATE // 1000  # and after its end
        self.pause_tail = settings.vad.pause_tail_ms * SAMPLE_RATE // 1000  # at a pause
        self.in_conversation = conversation is not None
        self.wake_gate = wake_gate
        self.session_id = session_id
        # False: push-to-talk (a conversation without turn detection): no VAD at all.
        self.detecting = conversation is None or detection is not None
        # Audio before this is in no future turn: committed (push-to-talk) or cleared.
        self.kept_from = 0
        self.partial_every = partial_interval_ms * SAMPLE_RATE // 1000
        # Times the input held the client back (its credit window or the ring full): the
        # audio comes faster than it is judged (partials.py).
        self.input_held = 0
        self.audio = StreamAudio()
        self.closed = False
        self.segment = -1
        self.finalized = -1  # the last segment whose final is out (or on its way)
        self.metrics = ctx.metrics
        # Per-turn span marks, only when tracing is on (ctx.tracer).
        self.tracing = ctx.tracer is not None
        # The hooks of what follows the listener (Replies): awaited in the listener's task,
        # so a hook that waits holds up the turns after it.
        self.on_speech_start: Callable[[int], Awaitable[None]] | None = None  # vad.start
        # (segment, text) after the segment's transcript.final; /v1/stream: only when the
        # text is not empty; conversation sessions: every committed turn (its item is done).
        self.on_final: Callable[[int, str], Awaitable[None]] | None = None
        # Assistant mode: (segment, text) a held-back reply to the turn not yet confirmed;
        # (segment) the user went on, withdraw it.
        self.on_speculate: Callable[[int, str], Awaitable[None]] | None = None
        self.on_resume: Callable[[int], Awaitable[None]] | None = None
        # Conversation sessions only:
        # (segment, its speech in ms) after its AudioCommitted is queued, before its final
        # is decoded.
        self.on_commit: Callable[[int, int], Awaitable[None]] | None = None
        # (segment, error) after its TranscriptFailed is queued; on_final is not called.
        self.on_failed: Callable[[int, VoxError], Awaitable[None]] | None = None
        # The id of the conversation's last item: AudioCommitted's previous_item_id.
        self.last_item_id: Callable[[], str | None] | None = None
        self.turn_done: Callable[[TurnMarks], None] | None = None  # asr mode: emit at final

    def feed_turns(self, probs: Float32Array) -> list[Heard]:
        """New VAD probabilities to the turn detector; behind a wake word, what the gate lets
        through, after the detections it heard (wake_gate.py)."""
        gate = self.wake_gate
        if gate is None:
            return list(self.turns.feed(probs.tolist()))
        heard: list[Heard] = list(gate.take_heard())
        turns = self.turns.feed(gate.mask(probs, self.turns.position, self.window).tolist())
        ended = any(isinstance(event, SpeechEnd) for event in turns)
        gate.after_turns(self.turns.position, self.turns.speaking, ended)
        return heard + turns

    def item_id(self, segment: int) -> str:
        """The conversation item of `segment`'s turn."""
        return speech_item_id(self.session_id, segment)

    def drop_hooks(self) -> None:
        """The session's callbacks are its bound methods: without dropping them the pair is a
        reference cycle, freed only by a full GC pass (soaks with session churn grew RSS)."""
        self.on_speech_start = self.on_final = self.turn_done = None
        self.on_speculate = self.on_resume = None
        self.on_commit = self.on_failed = self.last_item_id = None

    async def recognise(self, audio: Int16Array, *, partial_result: bool) -> AsrResult:
        """The one ASR call of every part: a final goes to the ASR batcher where there is
        one; a partial (and a final without one) is a stage call of its own."""
        if not partial_result and self.stream_window is not None:
            self.stream_window.shown = True  # its cost shows from now on (session_demand.py)
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

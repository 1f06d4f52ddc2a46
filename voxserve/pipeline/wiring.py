"""A session's parts for its mode, built and hooked together (pipeline/session.py).

asr:       audio -> AudioInput -> Listener (VAD, partials, finals)
tts:       text  -> TextInput -> Replies (Speaker)
assistant: audio -> AudioInput -> Listener -> Replies (responder, Speaker), with barge-in
conversation (assistant with StreamConfig.conversation, the Realtime API):
           audio -> AudioInput -> Listener -> Responses (items, responses on request,
           tools; responder, Speaker)

Apart from the session because this is the one place that knows which part calls which
(the listener's hooks are the replies' or the responses' methods); the session holds the
parts and is what a transport drives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from voxserve.audio.dedup import SeqDedup
from voxserve.engines.micro_wakeword import wake_names
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import StreamConfig
from voxserve.pipeline.context import SessionContext
from voxserve.pipeline.conversation.responses import Responses
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.synthesis.speaker import Speaker
from voxserve.pipeline.turns.audio_input import AudioInput, pooled_ring
from voxserve.pipeline.turns.listener import Listener
from voxserve.pipeline.turns.replies import Replies
from voxserve.pipeline.turns.text_input import TextInput
from voxserve.pipeline.turns.wake_gate import WakeGate


class CanTake(Protocol):
    def __call__(self, size: int, ahead: int = 0) -> bool: ...


def _no_room(size: int, ahead: int = 0) -> bool:
    return False


def _none_wanted() -> int:
    return 0


def _take_none(frames: list[tuple[int, memoryview]], now: float) -> None:
    raise VoxError(ErrorCode.WRONG_MODE, "tts sessions take text, not audio")


@dataclass(slots=True)
class SessionParts:
    """What `wire` built: the input (audio or text), the listener of an audio session, what
    answers (replies, or a conversation's responses), and the speaker."""

    speaker: Speaker
    replies: Replies | None
    responses: Responses | None
    listener: Listener | None
    audio: AudioInput | None
    text: TextInput | None
    input: AudioInput | TextInput
    dedup: SeqDedup
    # The WebSocket fast path's calls: the audio input's methods; a tts session's refuse.
    can_take_now: CanTake
    take_now: Callable[[list[tuple[int, memoryview]], float], None]
    wanted_in: Callable[[], int]


def wire(
    ctx: SessionContext,
    config: StreamConfig,
    outbox: Outbox,
    *,
    session_id: str,
    trace_id: str,
    language: str | None,
    voice: str,
    output_sample_rate: int,
    cache_scope: str,
) -> SessionParts:
    """The parts of a session of `config`'s mode (module docstring); an unknown wake word is
    refused before anything is acquired (the pooled ring, the speaker)."""
    settings = ctx.settings
    gate = wake_gate(ctx, config)
    speaker = Speaker(
        ctx,
        outbox,
        voice=voice,
        speed=config.speed,
        sample_rate=output_sample_rate,
        cache_scope=cache_scope,
    )
    emit_turn = (
        partial(ctx.tracer.emit, trace_id=trace_id, session_id=session_id, mode=config.mode)
        if ctx.tracer is not None
        else None
    )
    replies: Replies | None = None
    responses: Responses | None = None
    conversation = config.conversation if config.mode == "assistant" else None
    if conversation is not None:
        responses = Responses(
            ctx,
            outbox,
            speaker,
            session_id,
            conversation,
            voice=voice,
            sample_rate=output_sample_rate,
            emit_turn=emit_turn,
        )
    elif config.mode != "asr":
        replies = Replies(ctx, outbox, speaker, emit_turn)
    if config.mode == "tts":
        assert replies is not None
        text = TextInput(outbox, replies, max_chars=settings.limits.max_text_chars)
        return SessionParts(
            speaker,
            replies,
            responses,
            listener=None,
            audio=None,
            text=text,
            input=text,
            dedup=SeqDedup(),  # nothing to deduplicate: session.ended's zeros
            can_take_now=_no_room,
            take_now=_take_none,
            wanted_in=_none_wanted,
        )
    buffer, ring = pooled_ring(ctx, trace_id)
    listener = Listener(
        ctx,
        ring,
        outbox,
        language=language,
        partials=settings.asr.partials if config.partials is None else config.partials,
        partial_interval_ms=config.chunk_ms or settings.asr.partial_interval_ms,
        on_speech_start=(
            responses.speech_started
            if responses is not None
            else replies.barge_in
            if replies is not None
            else None
        ),
        on_final=(
            responses.user_final
            if responses is not None
            else replies.start
            if replies is not None
            else None
        ),
        conversation=config.conversation,
        session_id=session_id,
        wake_gate=gate,
        turn_detection=config.turn_detection,
    )
    if replies is not None:
        replies.listener = listener
        listener.on_speculate = replies.speculate
        listener.on_resume = replies.withdraw
    if responses is not None:
        responses.listener = listener
        listener.on_commit = responses.user_committed
        listener.on_failed = responses.user_failed
        listener.last_item_id = responses.conversation.last_id
    listener.turn_done = emit_turn
    audio = AudioInput(ctx, config.sample_rate, buffer, ring, listener, outbox)
    listener.stream_window = audio.credit  # marked once its first final is asked for
    return SessionParts(
        speaker,
        replies,
        responses,
        listener,
        audio,
        text=None,
        input=audio,
        dedup=audio.dedup,
        can_take_now=audio.can_take_now,
        take_now=audio.take_now,
        wanted_in=audio.wanted_in,
    )


def wake_gate(ctx: SessionContext, config: StreamConfig) -> WakeGate | None:
    """The gate of a session that asked for a `wake_word` (its name checked: an unknown one
    is `unknown_wake_word`, listing the enabled ones), else None."""
    if config.wake_word is None:
        return None
    engine = ctx.engines.wake
    (name,) = wake_names(engine, [config.wake_word])
    assert engine is not None  # wake_names refuses a server without wake words
    return WakeGate(engine.new_stream([name]), ctx.settings.wake.command_window_s)

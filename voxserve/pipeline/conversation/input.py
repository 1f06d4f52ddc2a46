"""The input side of a conversation session's `session.update` (the Realtime API).

The client sends the whole new config (the codec merges its partial update into the one it
holds); what the input takes from it: the sample rate (the resampler restarts, the audio
already received is kept), the language (checked against the engines, as at the start),
partials and their interval, and turn detection (Listener.set_turn_detection: from this
point of the audio on). The mode, and whether the session is a conversation, cannot change.
`check_input_update` raises what `apply_input_update` would, changing nothing, so that a
session's update (input and output sides) is applied whole or not at all.
"""

from __future__ import annotations

from voxserve.audio.resample import check_rate
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import StreamConfig
from voxserve.pipeline.context import SessionContext
from voxserve.pipeline.turns.audio_input import AudioInput
from voxserve.types import SAMPLE_RATE


def check_input_update(ctx: SessionContext, old: StreamConfig, new: StreamConfig) -> str | None:
    """The language a session started with `old` recognises after `new`; raises a
    VoxError (not fatal) for what cannot change."""
    if old.conversation is None:
        raise VoxError(ErrorCode.WRONG_MODE, "only a conversation session takes session.update")
    if new.mode != old.mode:
        raise VoxError(ErrorCode.INVALID_PARAMETER, "a session's mode cannot change")
    if new.conversation is None:
        raise VoxError(ErrorCode.INVALID_PARAMETER, "a conversation session cannot stop being one")
    if new.sample_rate != old.sample_rate:
        check_rate(new.sample_rate)
    engines = ctx.engines
    return engines.session_language(new.language)


def apply_input_update(
    ctx: SessionContext, old: StreamConfig, new: StreamConfig, audio: AudioInput
) -> str | None:
    """Apply the input side of `new` to `audio` and its listener; returns the language.
    Raises (changing nothing) as check_input_update."""
    language = check_input_update(ctx, old, new)
    assert old.conversation is not None and new.conversation is not None  # checked
    listener = audio.listener
    if new.sample_rate != old.sample_rate:
        audio.restart_resampler(new.sample_rate)
    listener.language = language
    asr = ctx.settings.asr
    listener.partials = asr.partials if new.partials is None else new.partials
    listener.partial_every = (new.chunk_ms or asr.partial_interval_ms) * SAMPLE_RATE // 1000
    if new.conversation.turn_detection != old.conversation.turn_detection:
        listener.set_turn_detection(new.conversation.turn_detection)
    return language

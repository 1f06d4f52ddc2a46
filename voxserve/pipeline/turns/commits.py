"""A conversation session's commits: each turn's AudioCommitted, and the client's commit and clear.

Every turn of a conversation session (the Realtime API) is committed: `AudioCommitted` after
its `VadEnd` (or, push-to-talk, at the client's commit), then `on_commit`, before its final.
With `turn_detection` None (push-to-talk) there is no VAD: the audio since the last commit
accumulates until the client commits it (at least MIN_COMMIT_MS) or clears it; with server
VAD a commit ends the turn in progress now and a clear drops it.

Apart from the listener because these are the client's rules, not VAD's: what may be
committed, what an empty commit is told (empty_audio), what a clear drops. The listener runs
them in their place in the audio (its controls) and handles the turn a commit ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from voxserve.errors import ErrorCode, VoxError
from voxserve.events import AudioCleared, AudioCommitted
from voxserve.pipeline.turns.detection import SpeechEnd
from voxserve.pipeline.turns.listen_state import ListenState, ms
from voxserve.types import SAMPLE_RATE

# Push-to-talk: the least audio a commit takes (the Realtime API's own minimum); less is
# refused as empty_audio, and left in the buffer.
MIN_COMMIT_MS = 100
MIN_COMMIT = MIN_COMMIT_MS * SAMPLE_RATE // 1000

OnTurn = Callable[[SpeechEnd], Awaitable[None]]  # the listener's handling of a turn's end


def held(stream: ListenState) -> int:
    """Samples received since the last commit or clear (push-to-talk's turn so far)."""
    return stream.audio.end - stream.kept_from


def push_to_talk_full(stream: ListenState) -> bool:
    """Push-to-talk audio is bounded as a VAD turn is (vad.max_utterance_s)."""
    return held(stream) >= stream.turns.max_utterance


def whole_turn(stream: ListenState) -> SpeechEnd:
    """Push-to-talk: the audio since the last commit, as a turn."""
    return SpeechEnd(stream.kept_from, stream.audio.end, forced=True)


async def committed(stream: ListenState, segment: int, audio_ms: int) -> None:
    """`segment`'s turn (`audio_ms` of speech) is committed: AudioCommitted, then
    `on_commit`."""
    previous = stream.last_item_id() if stream.last_item_id is not None else None
    item_id = stream.item_id(segment)
    await stream.outbox.event(
        AudioCommitted(segment=segment, item_id=item_id, previous_item_id=previous)
    )
    if stream.on_commit is not None:
        await stream.on_commit(segment, audio_ms)


async def _refuse_commit(stream: ListenState, why: str) -> None:
    """An empty commit: told, nothing committed, the buffer as it was."""
    await stream.outbox.event(VoxError(ErrorCode.EMPTY_AUDIO, why).to_event())


async def commit(stream: ListenState, turn: asyncio.Future[int | None], on_turn: OnTurn) -> None:
    """The client's commit, in its place in the audio; `turn` is its segment, or None if it
    is refused (Listener.commit)."""
    segment: int | None = None
    try:
        if stream.detecting:
            event = stream.turns.cut()
            if event is None:
                await _refuse_commit(stream, "no speech in progress to commit")
                return
            await on_turn(event)
            segment = stream.segment
            return
        buffered = held(stream)
        if buffered < MIN_COMMIT:
            await _refuse_commit(
                stream,
                f"no audio to commit: {ms(buffered)} ms buffered, at least {MIN_COMMIT_MS} ms"
                " needed",
            )
            return
        await on_turn(whole_turn(stream))
        segment = stream.segment
    finally:
        if not turn.done():  # the session may have given up on it (Responses.wait)
            turn.set_result(segment)


async def clear(stream: ListenState) -> None:
    """The client's clear, in its place in the audio: what no turn took is dropped."""
    if stream.detecting:
        if stream.turns.speaking:  # dropped: none of its partials is sent from now on
            stream.finalized = max(stream.finalized, stream.segment)
        stream.turns.drop()
    stream.kept_from = stream.audio.end
    stream.audio.trim(stream.audio.end)
    await stream.outbox.event(AudioCleared())

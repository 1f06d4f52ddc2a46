"""What a transport supplies to the session driver: its way in, and a few facts (`Wire`).

A transport supplies a `ClientInput`: `receive` waits for the client's next message (or
says the input ended), `decode` turns it into audio frames or a control message (its
codec), and `release` hands over audio the transport holds back (the WebSocket fast path;
nothing elsewhere). The driver's receiver does the rest, the same for every transport:
the idle clock, quota, feeding the session, and reporting errors.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, TypeVar

from voxserve.errors import ErrorCode, VoxError
from voxserve.events import (
    CancelMessage,
    ClearAudio,
    ClientMessage,
    CommitAudio,
    CreateItem,
    CreateResponse,
    CreditMessage,
    DeleteItem,
    EndMessage,
    MarkMessage,
    ResumeMessage,
    SessionUpdate,
    StartMessage,
    TextMessage,
    TruncateItem,
    TurnUpdate,
)
from voxserve.pipeline.session import Session

Frames = list[tuple[int, memoryview]]  # (seq_id, PCM16) per frame of one audio message
Decoded = Frames | ClientMessage
M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class Wire:
    """What the session driver needs to know of a transport besides its way in."""

    name: str  # the `transport` label of metrics.errors: "ws", "grpc"
    in_band_end: bool  # a fatal error is an event before session.ended (session/driver.py)
    stalls: bool  # output waits at most limits.stalled_client_s for the client to read
    tasks: str  # the prefix of its tasks' names
    charges_audio: bool = True  # False: the transport charges the audio quota itself (Wyoming)
    # > 0: after the client's in-band end, the session's `ended` waits until the client
    # closes its input (gRPC half-close) or sends nothing for this long (driver.py, linger)
    linger_s: float = 0.0


class InputEnd(enum.Enum):
    """How a client's input ends."""

    GONE = "gone"  # the client left (a WebSocket disconnect, a call cancelled): stop
    CLOSED = "closed"  # the client sends no more (gRPC half-close): the session finishes


class BadAudio(Exception):
    """An audio message that did not decode: `error` is reported, and the message counts
    in the session's `rejected` (received + rejected adds up to what the client sent)."""

    def __init__(self, error: VoxError) -> None:
        super().__init__(error.message)
        self.error = error


class ClientInput(Protocol[M]):
    """What a transport supplies for its way in (module docstring)."""

    async def receive(self) -> M | InputEnd:
        """The client's next message, undecoded; an InputEnd once there are no more."""
        ...

    def decode(self, message: M) -> Decoded:
        """Frames or a control message; raises VoxError (BadAudio for audio)."""
        ...

    def release(self) -> None:
        """Hand over the audio held back, then hold back no more than the session wants."""
        ...


async def apply_control(session: Session, message: ClientMessage) -> None:
    """A control message, the same on every wire."""
    if isinstance(message, TextMessage):
        await session.feed_text(message.text, flush=message.flush)
    elif isinstance(message, EndMessage):
        await session.end_input()
    elif isinstance(message, CancelMessage):
        await session.cancel()
    elif isinstance(message, MarkMessage):
        await session.mark(message.id)
    elif isinstance(message, CreditMessage):
        session.speaker.grant(message.audio_ms)
    elif isinstance(message, TurnUpdate):
        await session.update_turns(message.turn_detection)
    elif isinstance(message, StartMessage | ResumeMessage):
        raise VoxError(ErrorCode.ALREADY_STARTED, "the session has already started")
    elif isinstance(message, CreateItem):
        await session.create_item(message)
    elif isinstance(message, DeleteItem):
        await session.delete_item(message.item_id)
    elif isinstance(message, TruncateItem):
        await session.truncate_item(message.item_id, message.content_index, message.audio_end_ms)
    elif isinstance(message, CreateResponse):
        session.create_response(message.options)
    elif isinstance(message, SessionUpdate):
        try:
            await session.update(message.config)
        except VoxError as exc:
            # Named as the update's (realtime_session.UPDATE_STAGE): the Realtime codec then
            # drops the refused proposal, so later updates start from what is in force.
            exc.stage = "session.update"
            raise
    elif isinstance(message, CommitAudio):  # conversation sessions; else wrong_mode
        session.commit_audio()
    elif isinstance(message, ClearAudio):
        session.clear_audio()


async def feed_frames(session: Session, frames: Frames) -> None:
    """Each frame of a message as if it had come alone (so each refused one is counted);
    one error for the message, the first."""
    refused: VoxError | None = None
    for seq, pcm in frames:
        try:
            await session.feed_audio(seq, pcm)
        except VoxError as exc:
            refused = refused or exc
    if refused is not None:
        raise refused

"""One live stream: its identity, its mode's parts (wired by pipeline/wiring.py: asr,
tts, assistant, conversation), and their lifetime.

The session driver (server/session/driver.py) calls feed_audio (or, on the WebSocket's fast
path, can_take_audio_now / take_audio_now / audio_wanted_in) / feed_text / end_input / mark /
cancel, and the transport drains the outbox; `run` owns every task of the session and
returns after `session.ended` is queued. A conversation session (config.conversation; the
Realtime API) also takes commit_audio / clear_audio and, for `session.update`, the input
side of a new config (check_input_update / apply_input_update).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from functools import partial

from voxserve.errors import ErrorCode, VoxError, first_vox_error
from voxserve.events import (
    AUTO_LANGUAGE,
    CreateItem,
    ResponseOptions,
    SessionEnded,
    SessionStarted,
    SessionUpdated,
    StreamConfig,
    TurnDetection,
    TurnDetectionInfo,
)
from voxserve.pipeline.context import SessionContext
from voxserve.pipeline.conversation.input import apply_input_update, check_input_update
from voxserve.pipeline.conversation.responses import Responses
from voxserve.pipeline.conversation.session_update import (
    apply_on,
    check_output_update,
    model_lease,
)
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.scheduling.credit import CreditWindow
from voxserve.pipeline.turns.listen_state import server_detection
from voxserve.pipeline.turns.listener import Listener
from voxserve.pipeline.wiring import CanTake, wire
from voxserve.types import FRAME_MS, FRAME_SAMPLES

log = logging.getLogger(__name__)


class Session:
    """What a transport drives: one stream's parts, wired for its mode (module docstring)."""

    # The fast path's calls (server/websocket/link.py), bound in __init__ to the audio input's
    # methods, so a frame costs no call through the session (tts sessions: none taken).
    can_take_audio_now: CanTake
    """Whether `take_audio_now` may have a frame of `size` bytes after `ahead` bytes of
    frames before it in the same call (AudioInput.can_take_now)."""
    take_audio_now: Callable[[list[tuple[int, memoryview]], float], None]
    """`feed_audio` without a wait, for frames (seq, PCM) the socket's fast path hands
    over together, having checked `can_take_audio_now` (AudioInput.take_now)."""
    audio_wanted_in: Callable[[], int]
    """Samples of audio the fast path may hold back and hand over together
    (AudioInput.wanted_in)."""

    def __init__(
        self, ctx: SessionContext, config: StreamConfig, outbox: Outbox, *, cache_scope: str = ""
    ) -> None:
        """`ctx`: made by the runtime for this session, with a lease on the engines it runs
        on to its end (released by `release`), even if they are reloaded meanwhile.
        `cache_scope`: whose TTS cache entries its replies may use (cache/key.py)."""
        self.ctx = ctx
        self.config = config
        self.outbox = outbox
        self.id = uuid.uuid4().hex[:16]
        self.trace_id = config.trace_id or self.id
        settings = ctx.settings
        engines = ctx.engines
        self.language = engines.session_language(config.language)
        voice, _ = engines.voice(config.voice)
        self.voice = voice.id
        self.output_sample_rate = config.output_sample_rate or settings.tts.output_sample_rate
        self.input_config = config  # what the input side applied last (apply_input_update)
        self.started_at = time.monotonic()
        self.end_reason = "completed"  # session.ended's reason (server_shutdown, error codes)
        # Set by a transport that holds received audio back to hand it over in batches (the
        # WebSocket fast path): hands it over now, and from then on holds back at most
        # `audio_wanted_in()`. Called before and after input closes or drains.
        self.release_input: Callable[[], None] | None = None
        self._refused = 0  # tts mode: audio frames refused (audio modes count in `audio`)
        parts = wire(
            ctx,
            config,
            outbox,
            session_id=self.id,
            trace_id=self.trace_id,
            language=self.language,
            voice=self.voice,
            output_sample_rate=self.output_sample_rate,
            cache_scope=cache_scope,
        )  # an unknown wake word is refused here, before anything is acquired
        self.speaker = parts.speaker
        self.replies = parts.replies
        self.responses = parts.responses
        self.listener = parts.listener
        self.audio = parts.audio
        self.text = parts.text
        self._input = parts.input
        self.dedup = parts.dedup
        self.can_take_audio_now = parts.can_take_now
        self.take_audio_now = parts.take_now
        self.audio_wanted_in = parts.wanted_in
        # Audio modes: how many VAD batches of audio may wait in the ring before the
        # receiver stops reading (TCP pushes back); shrinks under stage pressure.
        self.credit: CreditWindow | None = self.audio.credit if self.audio else None

    def started_event(self) -> SessionStarted:
        return SessionStarted(
            session_id=self.id,
            trace_id=self.trace_id,
            mode=self.config.mode,
            sample_rate=self.config.sample_rate,
            encoding=self.config.encoding,
            language=self.language or AUTO_LANGUAGE,
            voice=self.voice,
            output_sample_rate=self.output_sample_rate,
            frame_ms=FRAME_MS,
            credit_window=self.credit.size if self.credit else None,
            resumable=self.config.resumable,
            turn_detection=self._turns_info(),
        )

    def _turns_info(self) -> TurnDetectionInfo | None:
        """/v1/stream's turn detection in force (None: tts mode, conversation sessions)."""
        if self.listener is None or self.config.conversation is not None:
            return None
        vad = self.ctx.settings.vad
        td = self.config.turn_detection or server_detection(vad)
        if td.type == "semantic_vad":
            return TurnDetectionInfo(type="semantic_vad", eagerness=td.eagerness)
        silence = td.silence_duration_ms or vad.hangover_ms
        return TurnDetectionInfo(type="server_vad", silence_duration_ms=silence)

    async def update_turns(self, detection: TurnDetection) -> None:
        """/v1/stream's `session.update`: new turn detection from this point of the audio
        on, then SessionUpdated with it."""
        if self.listener is None or self.config.conversation is not None:
            raise VoxError(
                ErrorCode.WRONG_MODE,
                "turn_detection is for asr and assistant sessions (Realtime: its session.update)",
            )
        self.listener.set_turn_detection(detection)
        self.config = dataclasses.replace(self.config, turn_detection=detection)
        await self.outbox.event(SessionUpdated(turn_detection=self._turns_info()))

    # -- counts and acknowledgement (session.ended; transports count refusals) ----------

    @property
    def received(self) -> int:
        return self.audio.received if self.audio is not None else 0

    @property
    def rejected(self) -> int:
        return self.audio.rejected if self.audio is not None else self._refused

    @rejected.setter
    def rejected(self, value: int) -> None:
        if self.audio is not None:
            self.audio.rejected = value
        else:
            self._refused = value

    @property
    def acked_seq(self) -> int | None:
        """The highest seq_id accepted (what a resumed client need not resend)."""
        return self.audio.acked_seq if self.audio is not None else None

    @property
    def input_closed(self) -> bool:
        """No more input is taken (`audio.end`, the end of the request stream)."""
        return self._input.closed

    # -- input, called by the transport ---------------------------------------------------

    async def feed_audio(self, seq: int, pcm: memoryview) -> None:
        """One frame, waiting while the credit window is used up or the ring is full."""
        if self.audio is None:
            self._refused += 1  # so that received + rejected adds up to what was sent
            raise VoxError(ErrorCode.WRONG_MODE, "tts sessions take text, not audio")
        await self.audio.feed(seq, pcm)

    async def feed_text(self, text: str, *, flush: bool = False) -> None:
        if self.text is None:
            raise VoxError(
                ErrorCode.WRONG_MODE, f"{self.config.mode} sessions take audio, not text"
            )
        await self.text.feed(text, flush=flush)

    def _input_stops(self, *, draining: bool) -> None:
        """Take the audio the transport holds (received before now), then drain or close
        input; the transport's hook, called again, then holds nothing back."""
        release = self.release_input
        if release is not None:
            release()
        self._input.stop(draining=draining)
        if release is not None:
            release()

    async def end_input(self) -> None:
        """No more input: finish what was accepted, then end the session."""
        if self._input.closed:
            return
        self._input_stops(draining=False)
        await self._input.end()

    def resumed(self) -> None:
        """A client reconnected (transport resume): what it resends up to acked_seq was
        already accepted."""
        if self.audio is not None:
            self.audio.resumed()

    async def drain(self) -> None:
        """Server shutdown: accept no more input, finish the turn in progress; the session
        then ends with reason `server_shutdown`. Audio received before this is taken."""
        self._input_stops(draining=True)
        self.end_reason = "server_shutdown"
        await self.end_input()

    async def mark(self, mark_id: str | int) -> None:
        """Audio modes: echoed once prior audio went through VAD. tts mode: once prior text
        has been spoken (synthesised and queued for sending)."""
        await self._input.mark(mark_id)

    # -- conversation sessions (the Realtime API): the input side ------------------------

    def commit_audio(self) -> None:
        """`CommitAudio`: the audio received until now is a user turn (Listener.commit);
        an empty commit is told (empty_audio) by the listener, in its place in the events;
        a `response.create` after it answers its turn (Responses.client_committed)."""
        turn = self._with_all_audio().commit()
        if self.responses is not None:
            self.responses.client_committed(turn)

    def clear_audio(self) -> None:
        """`ClearAudio`: drop the audio not yet committed (Listener.clear)."""
        self._with_all_audio().clear()

    def check_input_update(self, new: StreamConfig) -> None:
        """Raise the VoxError `apply_input_update(new)` would, changing nothing: so that a
        `session.update` is applied whole or not at all."""
        check_input_update(self.ctx, self.input_config, new)

    def apply_input_update(self, new: StreamConfig) -> None:
        """The input side of `session.update` (`new`: the whole new config): sample rate,
        language, partials, turn detection (pipeline/conversation/input.py), compared with
        the config the input last applied (`input_config`), from this point of the audio
        on. Raises a VoxError, changing nothing, for what cannot change. `config` is the
        caller's to replace."""
        check_input_update(self.ctx, self.input_config, new)
        assert self.audio is not None  # a conversation session takes audio
        self._take_held_audio()
        self.language = apply_input_update(self.ctx, self.input_config, new, self.audio)
        self.input_config = new

    def _with_all_audio(self) -> Listener:
        """The listener of a conversation session, given all the audio received so far."""
        listener = self.listener
        if self.config.conversation is None or listener is None:
            raise VoxError(
                ErrorCode.WRONG_MODE, "only a conversation session commits or clears audio"
            )
        if self._input.closed:
            raise VoxError(ErrorCode.INVALID_MESSAGE, "the audio input has ended")
        self._take_held_audio()
        assert self.audio is not None  # a listener's session has audio input
        self.audio.restart_resampler()  # the last ms the resampler holds back came before
        return listener

    def _take_held_audio(self) -> None:
        """Audio the transport holds back came before the message now applied."""
        release = self.release_input
        if release is not None:
            release()

    async def cancel(self) -> None:
        """Client barge-in: stop the current reply and forget text not yet spoken. In a
        conversation session: cancel the response in progress (`client_cancelled`), or
        refuse (RESPONSE_NOT_ACTIVE) when there is none, as the Realtime API does."""
        if self.text is not None:
            await self.text.clear()
        if self.replies is not None:
            self.replies.cancel()
        if self.responses is not None and not self.responses.cancel("client_cancelled"):
            raise VoxError(ErrorCode.RESPONSE_NOT_ACTIVE, "no response is in progress to cancel")

    # -- conversation sessions only (the Realtime API) ------------------------------------

    def _conversation(self, what: str) -> Responses:
        if self.responses is None:
            raise VoxError(ErrorCode.WRONG_MODE, f"{what} is for conversation sessions only")
        return self.responses

    async def create_item(self, message: CreateItem) -> None:
        await self._conversation("conversation.item.create").create_item(message)

    async def delete_item(self, item_id: str) -> None:
        await self._conversation("conversation.item.delete").delete_item(item_id)

    async def truncate_item(self, item_id: str, content_index: int, audio_end_ms: int) -> None:
        responses = self._conversation("conversation.item.truncate")
        await responses.truncate_item(item_id, content_index, audio_end_ms)

    def create_response(self, options: ResponseOptions) -> None:
        self._conversation("response.create").create(options)

    async def update(self, config: StreamConfig) -> None:
        """`session.update`: the new config applied, then SessionUpdated; or a VoxError
        (not fatal) and nothing changed. Output side (conversation/session_update.py): the
        voice, the output rate (from the next response on), the response defaults,
        whether the session responds, turn detection's create_response and
        interrupt_response; the input side is `apply_input_update`'s."""
        responses = self._conversation("session.update")
        voice, rate = check_output_update(self.ctx, self.config, config)
        lease = await model_lease(self.ctx, self.config, config)
        apply_on(self.ctx.lease, lease, partial(self.apply_input_update, config))
        self.config = config
        self.voice = responses.voice = voice
        self.output_sample_rate = responses.sample_rate = rate
        assert config.conversation is not None  # check_output_update refuses others
        responses.config = config.conversation
        await self.outbox.event(SessionUpdated())

    # -- running ------------------------------------------------------------------------

    async def run(self, before_end: Callable[[], Awaitable[None]] | None = None) -> None:
        """Run the session to its end. A failure that ends it surfaces as one VoxError (the
        first), not as the task groups' nested exception groups, so transports can map it.
        `before_end`: awaited once the work is done, before `session.ended` is queued (a
        transport that reads what its client still sends: those messages are answered and
        counted in `ended`)."""
        replies = self.replies
        try:
            async with asyncio.TaskGroup() as group:
                if replies is not None:
                    replies.group = group
                if self.responses is not None:
                    self.responses.group = group
                await self._input.run()
                if replies is not None:
                    await replies.wait()
                if self.responses is not None:
                    await self.responses.wait()
                if before_end is not None:
                    await before_end()
        except BaseExceptionGroup as errors:
            raise first_vox_error(errors) or errors from None
        finally:
            self.release()
        if self.audio is not None:
            self.audio.finish()
        await self.outbox.event(self.ended_event())
        await self.outbox.close()

    def release(self) -> None:
        """Give back the pooled buffer and the engine generation (the pipeline is over),
        and drop the stream's audio at once rather than at the next full GC pass."""
        if self.audio is not None:
            self.audio.release()
        if self.replies is not None:
            self.replies.release()
        if self.responses is not None:
            self.responses.release()
        self.ctx.lease.release()

    def ended_event(self) -> SessionEnded:
        audio = self.audio
        processed, dropped = (audio.processed, audio.dropped_samples) if audio else (0, 0)
        dropped_frames = -(-dropped // FRAME_SAMPLES)
        accepted = self.received - self.dedup.duplicates
        return SessionEnded(
            session_id=self.id,
            trace_id=self.trace_id,
            reason=self.end_reason,
            received=self.received,
            duplicates=self.dedup.duplicates,
            accepted=accepted,
            processed=max(0, processed - dropped_frames),
            dropped=dropped_frames,
            rejected=self.rejected,
            gaps=self.dedup.gaps,
            reordered=self.dedup.reordered,
            segments=(self.listener.segment + 1) if self.listener else 0,
            replies=self.speaker.replies,
            interrupted=self.speaker.interrupted,
            duration_ms=int((time.monotonic() - self.started_at) * 1000),
        )

"""One live stream: its trace id, input ring and dedup window, and the stages of its mode.

asr:       audio -> Listener (VAD, partials, finals)
tts:       text  -> SentenceBuffer -> Speaker
assistant: audio -> Listener -> Responder -> Speaker, with barge-in

The transport calls feed_audio / feed_text / end_input / cancel and drains the outbox; `run`
owns every task of the session and returns after `session.ended` is queued.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable

from voxserve.audio.dedup import SeqDedup, seq_delta
from voxserve.audio.pcm import Int16Array, int16_from_bytes
from voxserve.audio.resample import StreamResampler
from voxserve.audio.ring import SampleRing
from voxserve.errors import ErrorCode, VoxError, first_vox_error
from voxserve.observe.tracing import TurnMarks
from voxserve.pipeline.context import SessionContext
from voxserve.pipeline.credit import CreditWindow
from voxserve.pipeline.listener import Listener
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.speaker import Speaker
from voxserve.pipeline.stream_config import StreamConfig
from voxserve.text import SentenceBuffer
from voxserve.types import FRAME_SAMPLES, SAMPLE_RATE

log = logging.getLogger(__name__)

TEXT_QUEUE = 64  # sentences waiting for TTS in tts mode before the receiver waits
CREDIT_GROWTH_EVERY_S = 1.0  # the most often a growing credit window is announced
HISTORY_TURNS = 8  # (user, assistant) turns kept for the responder
PROCESSED_EVERY = 32  # accepted frames between counts of those VAD has been through
_FLUSH = object()  # end of one tts-mode utterance


class _Mark:
    __slots__ = ("id",)

    def __init__(self, mark_id: str | int) -> None:
        self.id = mark_id


class Session:
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
        self.language = engines.check_language(config.language) or engines.asr.languages[0]
        voice, _ = engines.voice(config.voice)
        self.voice = voice.id
        self.output_sample_rate = config.output_sample_rate or settings.tts.output_sample_rate
        self.started_at = time.monotonic()
        self.dedup = SeqDedup(settings.pipeline.dedup_window_ms / 1000)
        # The ring's storage comes from the process-wide pool (tts sessions need none).
        self.buffer = ctx.pool.acquire(self.trace_id) if config.mode != "tts" else None
        self.ring = SampleRing(
            settings.pipeline.ring_frames * FRAME_SAMPLES if self.buffer else FRAME_SAMPLES,
            self.buffer.samples if self.buffer else None,
        )
        ctx.metrics.track_ring(self.ring)
        self.drop_oldest = settings.pipeline.ring_full_policy == "drop_oldest"
        self.resampler = StreamResampler(config.sample_rate, SAMPLE_RATE)
        self.received = 0
        self.rejected = 0
        self.processed = 0
        self.dropped_samples = 0
        self._frame_ends: deque[int] = deque()  # ring position where each accepted frame ends
        self.input_closed = False
        self.draining = False  # the server is shutting down: input closed, turn finishing
        # Set by a transport that holds received audio back to hand it over in batches (the
        # WebSocket fast path): hands it over now, and from then on holds back at most
        # `audio_wanted_in()`. Called before and after input closes or drains.
        self.release_input: Callable[[], None] | None = None
        self._drain_told = False  # the client was told its audio is refused (once)
        self.end_reason = "completed"  # session.ended's reason (server_shutdown, error codes)
        self.acked_seq: int | None = None  # highest seq_id accepted (kept for resume)
        # After a resume: frames at or below this seq_id were accepted before the drop, so
        # a client resending them is deduplicated however long ago they came.
        self.resume_floor: int | None = None
        # Audio modes: how many VAD batches of audio may wait in the ring before the
        # receiver stops reading (TCP pushes back); shrinks under stage pressure.
        self.credit: CreditWindow | None = None
        if config.mode != "tts":
            self.credit = ctx.flow.input_window()
            self.credit.on_change = self._announce_credit
        # The window last told to the client (session.started tells the first) and when.
        self._credit_told = self.credit.size if self.credit else 0
        self._credit_told_at = 0.0
        self.speaker = Speaker(
            ctx,
            outbox,
            voice=self.voice,
            speed=config.speed,
            sample_rate=self.output_sample_rate,
            cache_scope=cache_scope,
        )
        self.listener: Listener | None = None
        if config.mode in ("asr", "assistant"):
            assistant = config.mode == "assistant"
            self.listener = Listener(
                ctx,
                self.ring,
                outbox,
                language=self.language,
                partials=settings.asr.partials if config.partials is None else config.partials,
                partial_interval_ms=config.chunk_ms or settings.asr.partial_interval_ms,
                on_speech_start=self._barge_in if assistant else None,
                on_final=self._start_reply if assistant else None,
            )
        if self.listener is not None and ctx.tracer is not None:
            self.listener.turn_done = self._emit_turn
        self._texts = SentenceBuffer()
        self._text_queue: asyncio.Queue[object] = asyncio.Queue(TEXT_QUEUE)
        self._history: deque[tuple[str, str]] = deque(maxlen=HISTORY_TURNS)
        self._reply_task: asyncio.Task[None] | None = None
        self._group: asyncio.TaskGroup | None = None

    def started_event(self) -> dict[str, object]:
        return {
            "type": "session.started",
            "session_id": self.id,
            "trace_id": self.trace_id,
            "mode": self.config.mode,
            "sample_rate": self.config.sample_rate,
            "encoding": self.config.encoding,
            "language": self.language,
            "voice": self.voice,
            "output_sample_rate": self.output_sample_rate,
            "frame_ms": 20,
            "credit_window": self.credit.size if self.credit else None,
            "resumable": self.config.resumable,
        }

    # -- input, called by the transport ---------------------------------------------------

    async def feed_audio(self, seq: int, pcm: memoryview) -> None:
        if not self._admit_audio(seq):
            return
        # Past the window already: the fast path (which never waits) wrote the frame that
        # crossed it, so this one waits before it is written, not only after.
        await self._within_credit()
        samples = self.resampler.process(int16_from_bytes(pcm))
        await self._write(samples)
        self._accepted(seq)
        await self._within_credit()

    def can_take_audio_now(self, size: int, ahead: int = 0) -> bool:
        """Whether `take_audio_now` may have a frame of `size` bytes, after `ahead` bytes of
        frames before it in the same call: nothing to wait for (under the credit window,
        room in the ring) and nothing to report (an audio session, input open, not
        draining). 16 kHz input only: a resampler's output size varies. Asked of a call's
        last frame, it answers for all of them (each is checked before it is written)."""
        listener, credit, ring = self.listener, self.credit, self.ring
        if listener is None or credit is None or self.draining or self.input_closed:
            return False
        queued = len(ring) + ahead // 2
        return (
            self.resampler.passthrough
            and queued < credit.size * listener.batch_samples
            and (self.drop_oldest or ring.capacity - queued >= size // 2)
        )

    def take_audio_now(self, frames: list[tuple[int, memoryview]], now: float) -> None:
        """`feed_audio` without a wait, for frames (seq, PCM) the socket's fast path
        (server/ws_fastpath.py) hands over together, having checked `can_take_audio_now`:
        the same counters and dedup, one ring write and one listener poke for all.
        `now`: the caller's time.monotonic()."""
        assert self.listener is not None
        ring = self.ring
        ends = self._frame_ends
        end = ring.write_total
        kept: list[memoryview] = []
        for seq, pcm in frames:
            if self._admit_audio(seq, now):
                kept.append(pcm)
                end += len(pcm) // 2
                ends.append(end)
                self._ack(seq)
        if not kept:
            return
        pcm = kept[0] if len(kept) == 1 else memoryview(b"".join(kept))
        if not ring.write_pcm(pcm):  # full, drop_oldest: the counted way
            self._write_now(int16_from_bytes(pcm))
        if len(ends) > PROCESSED_EVERY:
            self._count_processed()
        self.listener.poke()

    def audio_wanted_in(self) -> int:
        """Samples of audio that can wait before the listener wants them (its next VAD
        batch): what the fast path may hold back and hand over together. A batch already
        due is taken whole by the coming VAD round, so the next one starts empty. None
        once input is closed or draining: audio then is refused (and told) at once."""
        listener = self.listener
        if listener is None or self.input_closed or self.draining:
            return 0
        queued, batch = len(self.ring), listener.batch_samples
        return batch - queued if queued < batch else batch

    def _admit_audio(self, seq: int, now: float | None = None) -> bool:
        """Count a received frame; False for a duplicate (counted) or, once told, audio
        while draining; raises what the client must be told. A frame refused outright (a
        tts session, after the end of input) is counted in `rejected`, so that received +
        rejected still adds up to what the client sent."""
        if self.listener is None:
            self.rejected += 1
            raise VoxError(ErrorCode.WRONG_MODE, "tts sessions take text, not audio")
        if self.draining:
            self.received += 1
            self.rejected += 1
            if self._drain_told:
                return False  # told once; the rest is counted in session.ended `rejected`
            self._drain_told = True
            raise VoxError(
                ErrorCode.SHUTTING_DOWN, "the server is shutting down; no more audio is accepted"
            )
        if self.input_closed:
            self.rejected += 1
            raise VoxError(ErrorCode.INVALID_MESSAGE, "audio after the end of input")
        self.received += 1
        floor = self.resume_floor
        if floor is not None and seq_delta(seq, floor) <= 0:
            self.dedup.duplicates += 1  # resent after a resume: accepted before the drop
            return False
        return self.dedup.accept(seq, time.monotonic() if now is None else now)

    def _input_stops(self, *, draining: bool) -> None:
        """Take the audio the transport holds (received before now), then drain or close
        input; the transport's hook, called again, then holds nothing back."""
        release = self.release_input
        if release is not None:
            release()
        if draining:
            self.draining = True
        else:
            self.input_closed = True
        if release is not None:
            release()

    def _ack(self, seq: int) -> None:
        acked = self.acked_seq
        if acked is None or seq == acked + 1 or seq_delta(seq, acked) > 0:
            self.acked_seq = seq

    def _accepted(self, seq: int) -> None:
        """A frame is in the ring: advance the acknowledgement, wake VAD per batch."""
        assert self.listener is not None
        self._ack(seq)
        ends = self._frame_ends
        ends.append(self.ring.write_total)
        if len(ends) > PROCESSED_EVERY:  # counted in bulk: `processed` is read at the end
            self._count_processed()
        self.listener.poke()

    async def _within_credit(self) -> None:
        """Hold the receiver while more than the credit window of audio waits for VAD."""
        listener, credit = self.listener, self.credit
        assert listener is not None and credit is not None
        while len(self.ring) >= credit.size * listener.batch_samples and not self.input_closed:
            await listener.space_freed()

    def _announce_credit(self, window: int) -> None:
        """Tell the client its new input window (and what has been accepted so far). A
        smaller window is told at once; growth at most once a second, and when the window
        is whole again, so a window climbing back tick by tick is not an event per tick per
        stream. Never waits: a client not reading learns a later change instead."""
        now = time.monotonic()
        grows = window > self._credit_told
        whole = self.credit is not None and window == self.credit.maximum
        if grows and not whole and now - self._credit_told_at < CREDIT_GROWTH_EVERY_S:
            return
        if self.outbox.event_nowait(
            {"type": "credit", "window": window, "acked_seq": self.acked_seq}
        ):
            self._credit_told, self._credit_told_at = window, now

    async def _write(self, samples: Int16Array) -> None:
        assert self.listener is not None
        if not samples.size:
            return
        # "wait": stop reading from the client until the pipeline frees space (TCP pushes back).
        while not self.drop_oldest and self.ring.free < samples.size:
            await self.listener.space_freed()
        self._write_now(samples)

    def _write_now(self, samples: Int16Array) -> None:
        if self.drop_oldest:
            self.dropped_samples += self.ring.write(samples, drop_oldest=True)
        else:
            self.ring.write(samples)

    def _count_processed(self) -> None:
        done = self.ring.read_total
        ends = self._frame_ends
        while ends and ends[0] <= done:
            ends.popleft()
            self.processed += 1

    async def feed_text(self, text: str, *, flush: bool = False) -> None:
        if self.config.mode != "tts":
            raise VoxError(
                ErrorCode.WRONG_MODE, f"{self.config.mode} sessions take audio, not text"
            )
        if self.draining:
            raise VoxError(
                ErrorCode.SHUTTING_DOWN, "the server is shutting down; no more text is accepted"
            )
        if self.input_closed:
            raise VoxError(ErrorCode.INVALID_MESSAGE, "text after the end of input")
        limit = self.ctx.settings.limits.max_text_chars
        if len(text) + len(self._texts) > limit:
            raise VoxError(ErrorCode.TEXT_TOO_LONG, f"pending text would exceed {limit} characters")
        for sentence in self._texts.push(text):
            await self._text_queue.put(sentence)
        if flush:
            await self._flush_text()

    async def _flush_text(self) -> None:
        rest = self._texts.flush()
        if rest:
            await self._text_queue.put(rest)
        await self._text_queue.put(_FLUSH)

    async def end_input(self) -> None:
        """No more input: finish what was accepted, then end the session."""
        if self.input_closed:
            return
        self._input_stops(draining=False)
        if self.listener is not None:
            await self._write(self.resampler.flush())
            self.listener.close_input()
        else:
            await self._flush_text()
            await self._text_queue.put(None)

    def resumed(self) -> None:
        """A client reconnected (transport resume): what it resends up to acked_seq was
        already accepted."""
        self.resume_floor = self.acked_seq

    async def drain(self) -> None:
        """Server shutdown: accept no more input, finish the turn in progress; the session
        then ends with reason `server_shutdown`. Audio received before this is taken."""
        self._input_stops(draining=True)
        self.end_reason = "server_shutdown"
        await self.end_input()

    async def mark(self, mark_id: str | int) -> None:
        """Audio modes: echoed once prior audio went through VAD. tts mode: once prior text
        has been spoken (synthesised and queued for sending)."""
        if self.listener is not None and not self.input_closed:
            self.listener.mark(mark_id, self.acked_seq)
        elif self.listener is None:
            await self._text_queue.put(_Mark(mark_id))
        else:
            await self.outbox.event({"type": "mark", "id": mark_id})

    async def cancel(self) -> None:
        """Client barge-in: stop the current reply and forget text not yet spoken."""
        self._texts.clear()
        while not self._text_queue.empty():
            item = self._text_queue.get_nowait()
            if isinstance(item, _Mark):  # marks are answered, never lost
                await self.outbox.event({"type": "mark", "id": item.id})
            if item is None:  # keep the end-of-input marker
                await self._text_queue.put(None)
                break
        self._cancel_reply()

    # -- running ------------------------------------------------------------------------

    async def run(self) -> None:
        """Run the session to its end. A failure that ends it surfaces as one VoxError (the
        first), not as the task groups' nested exception groups, so transports can map it."""
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                if self.listener is not None:
                    await self.listener.run()
                else:
                    await self._speak_texts()
                if self._reply_task is not None:
                    await asyncio.wait([self._reply_task])
        except BaseExceptionGroup as errors:
            raise first_vox_error(errors) or errors from None
        finally:
            self.release()
        self._count_processed()
        await self.outbox.event(self.ended_event())
        await self.outbox.close()

    def release(self) -> None:
        """Give back the pooled buffer and the engine generation (the pipeline is over),
        and drop the stream's audio at once rather than at the next full GC pass."""
        if self.buffer is not None:
            self.ring.detach()
            self.buffer.release()
        if self.listener is not None:
            self.listener.release()
        if self.credit is not None:
            self.credit.on_change = None  # the flow's ticks stop telling a finished session
        self.ctx.lease.release()

    def ended_event(self) -> dict[str, object]:
        dropped_frames = -(-self.dropped_samples // FRAME_SAMPLES)
        accepted = self.received - self.dedup.duplicates
        return {
            "type": "session.ended",
            "session_id": self.id,
            "trace_id": self.trace_id,
            "reason": self.end_reason,
            "received": self.received,
            "duplicates": self.dedup.duplicates,
            "accepted": accepted,
            "processed": max(0, self.processed - dropped_frames),
            "dropped": dropped_frames,
            "rejected": self.rejected,
            "gaps": self.dedup.gaps,
            "reordered": self.dedup.reordered,
            "segments": (self.listener.segment + 1) if self.listener else 0,
            "replies": self.speaker.replies,
            "interrupted": self.speaker.interrupted,
            "duration_ms": int((time.monotonic() - self.started_at) * 1000),
        }

    async def _speak_texts(self) -> None:
        reply = 0
        while True:
            item = await self._text_queue.get()
            if item is None:
                return
            if item is _FLUSH:
                continue
            if isinstance(item, _Mark):
                await self.outbox.event({"type": "mark", "id": item.id})
                continue
            assert self._group is not None
            task = self._group.create_task(self._speak_utterance(str(item), reply))
            self._reply_task = task
            await asyncio.wait([task])
            reply += 1

    async def _speak_utterance(self, first: str, reply: int) -> None:
        async def sentences() -> AsyncIterator[str]:
            yield first
            while True:
                item = await self._text_queue.get()
                if item is _FLUSH:
                    return
                if item is None:  # end of input also ends the utterance
                    await self._text_queue.put(None)
                    return
                if isinstance(item, _Mark):
                    await self.outbox.event({"type": "mark", "id": item.id})
                    continue
                yield str(item)

        try:
            stats = await self.speaker.play(sentences(), reply)
        except VoxError as exc:
            if exc.fatal:  # e.g. client_stalled: the session ends
                raise
            await self.outbox.event(exc.to_event() | {"reply": reply})
            return
        if not stats.chunks and not stats.fallback:  # "....": no tts.start, say why
            empty = VoxError(ErrorCode.EMPTY_TEXT, "the text of this reply has nothing to speak")
            await self.outbox.event(empty.to_event() | {"reply": reply})

    # -- assistant ------------------------------------------------------------------------

    def _cancel_reply(self) -> bool:
        task = self._reply_task
        if task is not None and not task.done():
            task.cancel()
            return True
        return False

    async def _barge_in(self, segment: int) -> None:
        audible = self.speaker.audible()
        if self._cancel_reply() or audible:
            self.speaker.playback_until = 0.0
            await self.outbox.event({"type": "barge_in", "segment": segment})

    async def _start_reply(self, segment: int, text: str) -> None:
        self._cancel_reply()
        assert self._group is not None
        self._reply_task = self._group.create_task(
            self._reply(segment, text), name="voxserve-reply"
        )

    def _emit_turn(self, turn: TurnMarks) -> None:
        tracer = self.ctx.tracer
        if tracer is not None:
            tracer.emit(turn, trace_id=self.trace_id, session_id=self.id, mode=self.config.mode)

    async def _reply(self, segment: int, user_text: str) -> None:
        responder = self.ctx.engines.responder
        listener = self.listener
        since = listener.speech_ended_at(segment) if listener else None
        turn = listener.take_turn(segment) if listener else None
        metrics = self.ctx.metrics
        limit = self.ctx.settings.pipeline.responder.timeout_s
        sentences: asyncio.Queue[str | None] = asyncio.Queue(4)
        pieces: list[str] = []

        async def produce() -> None:
            buffer = SentenceBuffer()
            asked = time.perf_counter()
            if turn is not None:
                turn.mark("responder.start")
            stream = responder.respond(user_text, list(self._history))
            try:
                async with asyncio.timeout(limit):
                    async for piece in stream:
                        if not pieces:  # the responder's time to its first text
                            metrics.observe_stage("responder", time.perf_counter() - asked)
                        pieces.append(piece)
                        await self.outbox.event(
                            {"type": "response.delta", "reply": segment, "text": piece}
                        )
                        for sentence in buffer.push(piece):
                            await sentences.put(sentence)
            except TimeoutError:
                raise VoxError(
                    ErrorCode.STAGE_TIMEOUT,
                    f"responder did not finish within {limit:g} s",
                    stage="responder",
                ) from None
            finally:
                await _aclose(stream)
            if turn is not None:
                turn.mark("responder.end")
            rest = buffer.flush()
            if rest:
                await sentences.put(rest)
            await sentences.put(None)

        async def spoken() -> AsyncIterator[str]:
            while (sentence := await sentences.get()) is not None:
                yield sentence

        failures: list[VoxError] = []
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(produce())
                await self.speaker.play(spoken(), segment, since=since, turn=turn)
        except* VoxError as errors:
            failures = [exc for exc in errors.exceptions if isinstance(exc, VoxError)]
        finally:
            if turn is not None:
                self._emit_turn(turn)
        fatal = next((exc for exc in failures if exc.fatal), None)
        if fatal is not None:  # e.g. client_stalled: the session ends
            raise fatal
        if failures:
            for exc in failures:
                await self.outbox.event(exc.to_event() | {"reply": segment})
            return
        reply_text = "".join(pieces).strip()
        await self.outbox.event({"type": "response.text", "reply": segment, "text": reply_text})
        self._history.append((user_text, reply_text))


async def _aclose(stream: AsyncIterator[str]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()

"""A live session's audio input (asr and assistant modes): frames from the client into the
listener's ring.

Every frame is counted and deduplicated on arrival (`received`, `rejected`, the dedup
window and, after a resume, the floor of what was accepted before the drop); then the one
write step (`take_now`) puts it in the ring, acknowledges it (`acked_seq`) and notes where
it ends (for `processed`). Two ways in share that step: the WebSocket's fast path
(server/websocket/fastpath.py) takes frames inside the socket's read, several at a time, once
`can_take_now` says nothing has to wait or be reported; `feed` takes one frame and waits,
before and after writing it, while the credit window is used up or the ring has no room.

Credit: how many VAD batches of audio may wait in the ring before the receiver stops
reading (TCP pushes back); the window shrinks under stage pressure (pipeline/scheduling/flow.py) and
each change is told to the client.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from voxserve.audio.dedup import SeqDedup, seq_delta
from voxserve.audio.pcm import Int16Array, int16_from_bytes
from voxserve.audio.pool import PoolBuffer
from voxserve.audio.resample import StreamResampler
from voxserve.audio.ring import SampleRing
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import Credit, Mark
from voxserve.pipeline.context import SessionContext
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.turns.listener import Listener
from voxserve.types import FRAME_SAMPLES, SAMPLE_RATE

CREDIT_GROWTH_EVERY_S = 1.0  # the most often a growing credit window is announced
PROCESSED_EVERY = 32  # accepted frames between counts of those VAD has been through


def pooled_ring(ctx: SessionContext, trace_id: str) -> tuple[PoolBuffer, SampleRing]:
    """A session's input ring, its storage from the process-wide pool."""
    buffer = ctx.pool.acquire(trace_id)
    ring = SampleRing(ctx.settings.pipeline.ring_frames * FRAME_SAMPLES, buffer.samples)
    ctx.metrics.track_ring(ring)
    return buffer, ring


class AudioInput:
    """An audio session's frames on their way into the listener's ring (module docstring)."""

    __slots__ = (
        "_credit_told",
        "_credit_told_at",
        "_drain_told",
        "_frame_ends",
        "acked_seq",
        "buffer",
        "closed",
        "credit",
        "dedup",
        "draining",
        "drop_oldest",
        "dropped_samples",
        "listener",
        "outbox",
        "processed",
        "received",
        "rejected",
        "resampler",
        "resume_floor",
        "ring",
    )

    def __init__(
        self,
        ctx: SessionContext,
        sample_rate: int,
        buffer: PoolBuffer,
        ring: SampleRing,
        listener: Listener,
        outbox: Outbox,
    ) -> None:
        """`sample_rate`: the client's; `ring` (on `buffer`): what `listener` reads."""
        pipeline = ctx.settings.pipeline
        self.buffer = buffer
        self.ring = ring
        self.listener = listener
        self.outbox = outbox
        self.dedup = SeqDedup(pipeline.dedup_window_ms / 1000)
        self.drop_oldest = pipeline.ring_full_policy == "drop_oldest"
        self.resampler = StreamResampler(sample_rate, SAMPLE_RATE)
        self.received = 0
        self.rejected = 0
        self.processed = 0
        self.dropped_samples = 0
        self._frame_ends: deque[int] = deque()  # ring position where each accepted frame ends
        self.closed = False
        self.draining = False  # the server is shutting down: input closed, turn finishing
        self._drain_told = False  # the client was told its audio is refused (once)
        self.acked_seq: int | None = None  # highest seq_id accepted (kept for resume)
        # After a resume: frames at or below this seq_id were accepted before the drop, so
        # a client resending them is deduplicated however long ago they came.
        self.resume_floor: int | None = None
        self.credit = ctx.flow.input_window()
        self.credit.on_change = self._announce_credit
        # The window last told to the client (session.started tells the first) and when.
        self._credit_told = self.credit.size
        self._credit_told_at = 0.0

    # -- the way in ---------------------------------------------------------------------

    def can_take_now(self, size: int, ahead: int = 0) -> bool:
        """Whether `take_now` may have a frame of `size` bytes, after `ahead` bytes of
        frames before it in the same call: nothing to wait for (under the credit window,
        room in the ring) and nothing to report (input open, not draining). 16 kHz input
        only: a resampler's output size varies. Asked of a call's last frame, it answers
        for all of them (each is checked before it is written)."""
        if self.draining or self.closed:
            return False
        ring = self.ring
        queued = len(ring) + ahead // 2
        return (
            self.resampler.passthrough
            and queued < self.credit.size * self.listener.credit_samples
            and (self.drop_oldest or ring.capacity - queued >= size // 2)
        )

    def take_now(
        self, frames: list[tuple[int, memoryview]], now: float, admitted: bool = False
    ) -> None:
        """Write frames (seq, 16 kHz PCM) into the ring without waiting: each counted and
        deduplicated (unless `feed` has `admitted` it already), acknowledged and its end
        noted; one ring write and one listener poke for all. `now`: time.monotonic()."""
        ring = self.ring
        ends = self._frame_ends
        end = ring.write_total
        kept: list[memoryview] = []
        for seq, pcm in frames:
            if admitted or self._admit(seq, now):
                kept.append(pcm)
                end += len(pcm) // 2
                ends.append(end)
                self._ack(seq)
        if not kept:
            return
        pcm = kept[0] if len(kept) == 1 else memoryview(b"".join(kept))
        if not ring.write_pcm(pcm):  # full, drop_oldest: the counted way
            self._write_now(int16_from_bytes(pcm))
        if len(ends) > PROCESSED_EVERY:  # counted in bulk: `processed` is read at the end
            self._count_processed()
        self.listener.poke()

    async def feed(self, seq: int, pcm: memoryview) -> None:
        """`take_now` for one frame at any rate, waiting first (and after) while the
        credit window is used up, and for room in the ring (ring_full_policy "wait")."""
        if not self._admit(seq):
            return
        # Past the window already: the fast path (which never waits) wrote the frame that
        # crossed it, so this one waits before it is written, not only after.
        await self._within_credit()
        samples = self.resampler.process(int16_from_bytes(pcm))
        if not self.resampler.passthrough:
            pcm = np.ascontiguousarray(samples, dtype="<i2").data.cast("B")
        await self._room_for(samples.size)
        self.take_now([(seq, pcm)], 0.0, admitted=True)
        await self._within_credit()

    def wanted_in(self) -> int:
        """Samples of audio that can wait before the listener wants them (its next VAD
        batch): what the fast path may hold back and hand over together. A batch already
        due is taken whole by the coming VAD round, so the next one starts empty. None
        once input is closed or draining: audio then is refused (and told) at once."""
        if self.closed or self.draining:
            return 0
        queued, batch = len(self.ring), self.listener.batch_samples
        return batch - queued if queued < batch else batch

    def _admit(self, seq: int, now: float | None = None) -> bool:
        """Count a received frame; False for a duplicate (counted) or, once told, audio
        while draining; raises what the client must be told. A frame refused outright
        (after the end of input) is counted in `rejected`, so that received + rejected
        still adds up to what the client sent."""
        if self.draining:
            self.received += 1
            self.rejected += 1
            if self._drain_told:
                return False  # told once; the rest is counted in session.ended `rejected`
            self._drain_told = True
            raise VoxError(
                ErrorCode.SHUTTING_DOWN, "the server is shutting down; no more audio is accepted"
            )
        if self.closed:
            self.rejected += 1
            raise VoxError(ErrorCode.INVALID_MESSAGE, "audio after the end of input")
        self.received += 1
        floor = self.resume_floor
        if floor is not None and seq_delta(seq, floor) <= 0:
            self.dedup.duplicates += 1  # resent after a resume: accepted before the drop
            return False
        return self.dedup.accept(seq, time.monotonic() if now is None else now)

    def _ack(self, seq: int) -> None:
        acked = self.acked_seq
        if acked is None or seq == acked + 1 or seq_delta(seq, acked) > 0:
            self.acked_seq = seq

    async def _within_credit(self) -> None:
        """Hold the receiver while more than the credit window of audio waits for VAD."""
        listener, credit = self.listener, self.credit
        while len(self.ring) >= credit.size * listener.credit_samples and not self.closed:
            listener.input_held += 1
            await listener.space_freed()

    async def _room_for(self, samples: int) -> None:
        """ "wait": stop reading from the client until the pipeline frees space (TCP
        pushes back)."""
        while not self.drop_oldest and self.ring.free < samples:
            self.listener.input_held += 1
            await self.listener.space_freed()

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

    def _announce_credit(self, window: int) -> None:
        """Tell the client its new input window (and what has been accepted so far). A
        smaller window is told at once; growth at most once a second, and when the window
        is whole again, so a window climbing back tick by tick is not an event per tick per
        stream. Never waits: a client not reading learns a later change instead."""
        now = time.monotonic()
        grows = window > self._credit_told
        whole = window == self.credit.maximum
        if grows and not whole and now - self._credit_told_at < CREDIT_GROWTH_EVERY_S:
            return
        if self.outbox.event_nowait(Credit(window=window, acked_seq=self.acked_seq)):
            self._credit_told, self._credit_told_at = window, now

    def restart_resampler(self, rate: int | None = None) -> None:
        """A new resampler, from the client's next frame at `rate` (None: the same rate):
        a conversation session's `session.update` (e.g. G.711 8 kHz after 24 kHz PCM), or
        its commit, which takes all the audio sent before it (a resampler holds back the
        last few ms it was given). The old resampler's tail goes into the ring first,
        after the audio already there; a tail that finds the ring full ("wait") is counted
        in `dropped_samples`, never lost unsaid."""
        if rate is None and self.resampler.passthrough:
            return
        tail = self.resampler.flush()
        self.resampler = StreamResampler(rate or self.resampler.from_rate, SAMPLE_RATE)
        if not tail.size:
            return
        if self.drop_oldest or self.ring.free >= tail.size:
            self._write_now(tail)
            self.listener.poke()
        else:
            self.dropped_samples += int(tail.size)

    async def run(self) -> None:
        """The listener's work on this input, until it has finished what the input took."""
        await self.listener.run()

    # -- the end --------------------------------------------------------------------------

    def stop(self, *, draining: bool) -> None:
        """No more audio: refused as after the end of input, or (`draining`) as the server
        shuts down (told once, then counted)."""
        if draining:
            self.draining = True
        else:
            self.closed = True

    async def end(self) -> None:
        """After `stop`: the resampler's tail into the ring; the listener finishes what the
        ring holds, then ends."""
        tail = self.resampler.flush()
        if tail.size:
            await self._room_for(tail.size)
            self._write_now(tail)
        self.listener.close_input()

    async def mark(self, mark_id: str | int) -> None:
        """Echoed once prior audio went through VAD (with what was accepted before it);
        at once after the end of input."""
        if not self.closed:
            self.listener.mark(mark_id, self.acked_seq)
        else:
            await self.outbox.event(Mark(id=mark_id))

    def resumed(self) -> None:
        """A client reconnected: what it resends up to acked_seq was already accepted."""
        self.resume_floor = self.acked_seq

    def finish(self) -> None:
        """The pipeline is over: count what VAD went through, for session.ended."""
        self._count_processed()

    def release(self) -> None:
        """Give back the pooled buffer (later writes are discarded), drop the listener's
        audio, and stop the flow's ticks telling a finished session."""
        self.ring.detach()
        self.buffer.release()
        self.listener.release()
        self.credit.on_change = None
        self.credit.ended = True  # not a live stream any more, even before it is collected

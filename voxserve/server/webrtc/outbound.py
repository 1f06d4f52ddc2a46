"""The reply audio as a WebRTC track: PCM16 mono 48 kHz paced in real time, 20 ms a frame.

aiortc's sender pulls recv() in a loop and sends each frame at once, so the pace of the
outgoing audio is the pace of recv(): frame n is due at start + n * 20 ms on the monotonic
clock (never drifting with the cost of encoding), and a WebRTC track never pauses: when no
reply audio is buffered a frame of silence goes out. A frame carries the audio of one reply
only, so what was played of each reply (for truncating the assistant item on barge-in) and
when a reply started and stopped on the wire are exact to the frame.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from fractions import Fraction
from typing import TypeVar

from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from voxserve.errors import ErrorCode, VoxError

_V = TypeVar("_V")
log = logging.getLogger(__name__)

RATE = 48_000
FRAME_MS = 20
FRAME_SAMPLES = RATE * FRAME_MS // 1000  # 960
FRAME_BYTES = FRAME_SAMPLES * 2
BYTES_PER_MS = RATE * 2 // 1000  # 96
TIME_BASE = Fraction(1, RATE)
MAX_CATCH_UP_S = 0.2  # later than this, the clock is re-anchored rather than bursting frames
LAG_WINDOW = 3000  # frames kept for percentiles (one minute)
LATE_MS = 5.0  # a timer wakes a little after its due time: that slack is not lateness
REPLIES_KEPT = 64  # per-reply records kept (played_ms, cleared) for the latest replies


class FrameLag:
    """How late each frame went out against its due time, in ms (0 when on time)."""

    def __init__(
        self, window: int = LAG_WINDOW, sink: Callable[[float], None] | None = None
    ) -> None:
        self.sink = sink  # e.g. a metrics histogram: gets every frame's lateness in seconds
        self.frames = 0
        self.late_frames = 0  # frames that went out more than LATE_MS after their due time
        self.max_ms = 0.0
        self.resyncs = 0  # times the clock was re-anchored after falling far behind
        self.recent: deque[float] = deque(maxlen=window)

    def record(self, late_ms: float) -> None:
        self.frames += 1
        if late_ms > LATE_MS:
            self.late_frames += 1
        self.max_ms = max(self.max_ms, late_ms)
        late_ms = max(0.0, late_ms)
        self.recent.append(late_ms)
        if self.sink is not None:
            self.sink(late_ms / 1000)

    def percentile(self, q: float) -> float:
        """The q-th percentile (0..100) of the recent frames' lateness, in ms."""
        if not self.recent:
            return 0.0
        ordered = sorted(self.recent)
        index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
        return ordered[index]


class OutboundTrack(MediaStreamTrack):
    """The outgoing audio track of a call; write() never blocks, recv() paces."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.on_started: Callable[[int], None] | None = None
        self.on_stopped: Callable[[int], None] | None = None
        self.lag = FrameLag()
        self.frames_sent = 0
        self._chunks: deque[tuple[int, memoryview]] = deque()
        self._head = 0  # bytes of _chunks[0] already sent
        self._buffered = 0
        self._reply_bytes: dict[int, int] = {}  # bytes buffered per reply
        self._finished: set[int] = set()
        self._played: dict[int, int] = {}  # bytes sent per reply (insertion = reply order)
        self._closed: dict[int, None] = {}  # replies stopped or cleared: later writes dropped
        self._start: float | None = None
        self._pts = 0

    @property
    def buffered_ms(self) -> float:
        return self._buffered / BYTES_PER_MS

    def write(self, pcm: bytes, reply: int) -> None:
        """Queue PCM16 mono 48 kHz audio of `reply` (dropped once it was finished or cleared)."""
        if len(pcm) % 2:
            raise VoxError(ErrorCode.ODD_LENGTH_PCM, f"PCM16 payload has odd length {len(pcm)}")
        if not pcm or reply in self._closed or reply in self._finished:
            return
        self._chunks.append((reply, memoryview(pcm)))
        self._buffered += len(pcm)
        self._reply_bytes[reply] = self._reply_bytes.get(reply, 0) + len(pcm)

    def finish(self, reply: int) -> None:
        """No more audio of `reply`; on_stopped fires once its last audio went out.

        A reply none of whose audio went out neither starts nor stops.
        """
        if reply in self._closed:
            return
        self._finished.add(reply)
        if self._reply_bytes.get(reply, 0) == 0:
            self._stopped(reply)

    def clear(self) -> int:
        """Drop all buffered audio (barge-in); returns the ms dropped. No on_stopped fires."""
        dropped = self._buffered
        for reply in list(self._reply_bytes):
            self._close(reply)
        self._chunks.clear()
        self._head = 0
        self._buffered = 0
        self._reply_bytes.clear()
        self._finished.clear()
        return dropped // BYTES_PER_MS

    def played_ms(self, reply: int) -> int:
        return self._played.get(reply, 0) // BYTES_PER_MS

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        await self._pace()
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(self._next_payload())
        frame.sample_rate = RATE
        frame.time_base = TIME_BASE
        frame.pts = self._pts
        self._pts += FRAME_SAMPLES
        self.frames_sent += 1
        return frame

    async def _pace(self) -> None:
        now = time.monotonic()
        if self._start is None:
            self._start = now
            self.lag.record(0.0)
            return
        due = self._start + (self.frames_sent * FRAME_MS) / 1000
        if due > now:
            await asyncio.sleep(due - now)
            now = time.monotonic()
        late = now - due
        self.lag.record(late * 1000)
        if late > MAX_CATCH_UP_S:  # the consumer stalled: resume the pace from now, no burst
            self._start += late
            self.lag.resyncs += 1

    def _next_payload(self) -> bytes:
        if not self._chunks:
            return bytes(FRAME_BYTES)
        reply = self._chunks[0][0]
        available = self._reply_bytes.get(reply, 0)
        if available < FRAME_BYTES and reply not in self._finished:
            return bytes(FRAME_BYTES)  # underrun mid-reply: wait for a whole frame
        out = bytearray(FRAME_BYTES)
        filled = 0
        while filled < FRAME_BYTES and self._chunks and self._chunks[0][0] == reply:
            view = self._chunks[0][1]
            take = min(FRAME_BYTES - filled, len(view) - self._head)
            out[filled : filled + take] = view[self._head : self._head + take]
            filled += take
            self._head += take
            if self._head == len(view):
                self._chunks.popleft()
                self._head = 0
        self._buffered -= filled
        self._reply_bytes[reply] = available - filled
        first = reply not in self._played
        self._remember(self._played, reply)
        self._played[reply] = self._played.get(reply, 0) + filled
        if first:
            self._notify(self.on_started, reply)
        if self._reply_bytes[reply] == 0 and reply in self._finished:
            self._stopped(reply)
        return bytes(out)

    def _stopped(self, reply: int) -> None:
        self._reply_bytes.pop(reply, None)
        self._finished.discard(reply)
        self._close(reply)
        if reply in self._played:
            self._notify(self.on_stopped, reply)

    def _close(self, reply: int) -> None:
        self._remember(self._closed, reply)
        self._closed[reply] = None

    @staticmethod
    def _notify(callback: Callable[[int], None] | None, reply: int) -> None:
        """Run a callback from the media loop: its failure must not stop the track."""
        if callback is None:
            return
        try:
            callback(reply)
        except Exception:
            log.exception("webrtc track callback failed (reply %d)", reply)

    @staticmethod
    def _remember(record: dict[int, _V], reply: int) -> None:
        """Keep per-reply records bounded: forget the oldest replies."""
        if reply in record:
            return
        while len(record) >= REPLIES_KEPT:
            del record[next(iter(record))]

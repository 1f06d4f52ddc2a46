"""An audio jitter buffer for aiortc's receiver that loses only what the network lost.

aiortc 1.16 gives audio the same frame-reassembly buffer as video (capacity 16, prefetch 4):
behind a lost packet it stalls until 16 later packets arrived, then evicts the up to 4 good
packets it was holding before the hole. One lost packet so costs ~5 frames and leaves ~280 ms
of delay for the rest of the call; at 10% loss only ~56% of the audio reaches the decoder.
An Opus RTP packet is a whole frame, so audio needs no reassembly: this buffer hands each
packet on as soon as it is next in sequence, waits for a missing one only until REORDER later
packets arrived (then skips it: InboundAudio sees the pts gap and conceals it), and drops late
and duplicate packets. The receiver takes one frame per packet it is given, so the delay a
skipped hole leaves behind is at most REORDER packets (60 ms).

Every packet handed on is decoded (aiortc's decoder thread) and queued on the track, whose
queue aiortc does not bound: a caller sending faster than real time would cost the server
CPU and memory at its pace, not the call's. So packets pass at most MAX_PACKETS_S a second
(the shortest Opus packet a browser sends is 10 ms), with a BURST of backlog at once; the
rest are dropped and counted (`flooded`, and one warning per call, no content).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiortc import RTCRtpReceiver
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtp import RtpPacket

log = logging.getLogger(__name__)

REORDER = 3  # packets that may overtake a missing one before it counts as lost
MAX_MISORDER = 100  # a larger jump in sequence numbers: the stream restarted, resynchronise
MAX_PACKETS_S = 100  # packets a second handed on, on average (10 ms packets)
BURST = 100  # ... and this many at once (a second of 20 ms packets a network held back)
_PRIVATE = "_RTCRtpReceiver__jitter_buffer"  # where RTCRtpReceiver keeps its buffer


class AudioJitterBuffer:
    """Reorders audio RTP packets; gives up on a missing packet after REORDER later ones."""

    capacity = 2 * MAX_MISORDER

    def __init__(
        self, reorder: int = REORDER, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.reorder = reorder
        self.clock = clock  # tests set it
        self.skipped = 0  # packets given up on (lost, or later than `reorder` packets)
        self.late = 0  # packets dropped: arrived after being skipped, or duplicates
        self.resyncs = 0
        self._next: int | None = None  # extended sequence number handed on next
        self._max = 0  # highest extended sequence number received
        self._packets: dict[int, RtpPacket] = {}
        # time.monotonic() of the last packet that came in (read or not: the call's media
        # watch must not take a session slow to read for a caller gone silent)
        self.last_packet_at = clock()
        self.flooded = 0  # packets dropped for coming faster than MAX_PACKETS_S
        self._tokens = float(BURST)

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        """Store a packet; return the next frame in sequence when there is one (never PLI)."""
        now = self.clock()
        self._tokens = min(BURST, self._tokens + (now - self.last_packet_at) * MAX_PACKETS_S)
        self.last_packet_at = now
        if self._tokens < 1:
            if not self.flooded:
                log.warning("webrtc caller sends RTP faster than real time: packets dropped")
            self.flooded += 1
            return False, None
        self._tokens -= 1
        seq = self._extend(packet.sequence_number)
        if self._next is None or abs(seq - self._next) > MAX_MISORDER:
            if self._next is not None:
                self.resyncs += 1
            self._packets.clear()
            self._next = self._max = seq
        if seq < self._next or seq in self._packets:
            self.late += 1
            return False, None
        self._packets[seq] = packet
        self._max = max(self._max, seq)
        while self._next not in self._packets and self._max - self._next >= self.reorder:
            self._next += 1
            self.skipped += 1
        found = self._packets.pop(self._next, None)
        if found is None:
            return False, None
        self._next += 1
        data: bytes = getattr(found, "_data", found.payload)  # the receiver's depayloaded data
        return False, JitterFrame(data=data, timestamp=found.timestamp)

    def _extend(self, seq: int) -> int:
        """A 16-bit sequence number as a number that keeps counting across wrap-around."""
        if self._next is None:
            return seq
        delta = (seq - self._max) & 0xFFFF
        if delta >= 0x8000:
            delta -= 0x10000
        return self._max + delta


def use_audio_jitter_buffer(receiver: RTCRtpReceiver) -> AudioJitterBuffer:
    """Put an AudioJitterBuffer in an audio receiver, before its first packet arrives."""
    if not hasattr(receiver, _PRIVATE):
        raise RuntimeError("this aiortc keeps no jitter buffer where 1.16 does")
    buffer = AudioJitterBuffer()
    setattr(receiver, _PRIVATE, buffer)
    return buffer

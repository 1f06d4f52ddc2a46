"""A bounded, pre-allocated ring of int16 samples between the receiver and the pipeline.

Written by the transport (one frame per message, copied straight from the message's bytes:
the only copy on the receive path), read by the session's pipeline task in batches (all
pending samples per wake-up), so nothing is allocated per frame and no task is woken per
frame. The read and write cursors only ever grow; positions are taken modulo the capacity.
The storage is normally a buffer of the process-wide pool (audio/pool.py).

Full-buffer policy (`pipeline.ring_full_policy`): `wait` (default) stops reading the
socket until the pipeline frees space, so TCP pushes back on the client; `drop_oldest`
drops the oldest unread audio, counted and reported as `dropped` in `session.ended`.
Never unbounded growth.
"""

from __future__ import annotations

import sys

import numpy as np

from voxserve.audio.pcm import Int16Array

_LITTLE_ENDIAN = sys.byteorder == "little"


class RingFull(Exception):
    pass


class SampleRing:
    """Single-producer, single-consumer ring on one event loop (no locks needed)."""

    def __init__(self, capacity_samples: int, buffer: Int16Array | None = None) -> None:
        if capacity_samples <= 0:
            raise ValueError("capacity must be positive")
        if buffer is not None and buffer.size < capacity_samples:
            raise ValueError("buffer smaller than the capacity")
        self._buf = buffer if buffer is not None else np.zeros(capacity_samples, dtype=np.int16)
        self._bytes = self._buf.data.cast("B")  # for write_pcm: no array per frame
        self.capacity = capacity_samples
        self._write = 0  # total samples ever written
        self._read = 0  # total samples ever read
        self.dropped_samples = 0
        self._detached = False

    def __len__(self) -> int:
        return self._write - self._read

    @property
    def read_total(self) -> int:
        """Samples ever consumed (read or dropped)."""
        return self._read

    @property
    def write_total(self) -> int:
        return self._write

    @property
    def free(self) -> int:
        return self.capacity if self._detached else self.capacity - len(self)

    def write(self, samples: Int16Array, *, drop_oldest: bool = False) -> int:
        """Append samples. When they do not fit: drop the oldest unread samples (counted) if
        `drop_oldest`, else raise RingFull and write nothing. Returns samples dropped."""
        n = int(samples.size)
        if n > self.capacity:
            raise ValueError("write larger than the ring")
        if self._detached:
            return 0
        dropped = 0
        if n > self.free:
            if not drop_oldest:
                raise RingFull()
            dropped = n - self.free
            self._read += dropped
            self.dropped_samples += dropped
        start = self._write % self.capacity
        first = min(n, self.capacity - start)
        self._buf[start : start + first] = samples[:first]
        if first < n:
            self._buf[: n - first] = samples[first:]
        self._write += n
        return dropped

    def write_pcm(self, pcm: memoryview) -> bool:
        """Append little-endian PCM16 bytes as they came off the socket, without making an
        array of them (the receive fast path, once per 20 ms frame). False, writing
        nothing, when they do not fit."""
        n = len(pcm) // 2
        if self._detached:
            return True
        if not _LITTLE_ENDIAN:  # the ring holds native int16
            self.write(np.frombuffer(pcm, dtype="<i2").astype(np.int16))
            return True
        if n > self.capacity - (self._write - self._read):
            return False
        start = self._write % self.capacity
        first = min(n, self.capacity - start)
        view = self._bytes
        view[2 * start : 2 * (start + first)] = pcm[: 2 * first]
        if first < n:
            view[: 2 * (n - first)] = pcm[2 * first :]
        self._write += n
        return True

    def detach(self) -> None:
        """Stop using the (pooled) buffer before it goes back to the pool: the session is
        over, so later writes are discarded (never land in another session's buffer) and
        nothing is allocated for them."""
        self._buf = np.zeros(0, dtype=np.int16)
        self._bytes = self._buf.data.cast("B")
        self._detached = True

    def read(self, max_samples: int | None = None) -> Int16Array:
        """Take up to `max_samples` (default: all) unread samples as one contiguous copy."""
        n = len(self) if max_samples is None else min(max_samples, len(self))
        if self._detached:
            n = 0
        start = self._read % self.capacity
        first = min(n, self.capacity - start)
        if first == n:
            out = self._buf[start : start + n].copy()
        else:
            out = np.concatenate((self._buf[start:], self._buf[: n - first]))
        self._read += n
        return out

"""Idempotent frames: a seq_id seen again within the window is processed once.

Also keeps the order bookkeeping `session.ended` reports: gaps (ids skipped) and late
arrivals that filled an earlier gap. Sequence ids are 32-bit and may wrap.
"""

from __future__ import annotations

from collections import deque

SEQ_MOD = 1 << 32
_HALF = SEQ_MOD // 2


def seq_delta(a: int, b: int) -> int:
    """Signed distance a - b on the 32-bit circle."""
    d = (a - b) % SEQ_MOD
    return d - SEQ_MOD if d >= _HALF else d


class SeqDedup:
    """Remembers seq_ids for `window_s` seconds (default 500 ms)."""

    def __init__(self, window_s: float = 0.5) -> None:
        self.window_s = window_s
        self._seen: dict[int, float] = {}
        self._order: deque[tuple[float, int]] = deque()
        self._highest: int | None = None
        # Expiry runs once per quarter window, not per frame (a frame's memory lasts
        # window_s to 1.25 window_s): the same duplicates caught at a fraction of the cost.
        self._expire_every = window_s / 4
        self._next_expiry = 0.0
        self.duplicates = 0
        self.gaps = 0  # ids skipped and not (yet) received
        self.reordered = 0  # ids that arrived after a higher id

    def accept(self, seq: int, now: float) -> bool:
        """True if this frame is new and must be processed; False for a duplicate."""
        if now >= self._next_expiry:
            self._next_expiry = now + self._expire_every
            self._expire(now)
        if seq in self._seen:
            self.duplicates += 1
            return False
        self._seen[seq] = now
        self._order.append((now, seq))
        highest = self._highest
        if highest is None or seq == highest + 1:  # the usual case: the next one
            self._highest = seq
            return True
        delta = seq_delta(seq, highest)
        if delta > 0:
            self.gaps += delta - 1
            self._highest = seq
        else:
            # An id below the highest: a late frame that fills a gap (or an old duplicate
            # whose memory has expired; both are counted as reordered).
            self.reordered += 1
            if self.gaps > 0:
                self.gaps -= 1
        return True

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        order = self._order
        while order and order[0][0] < horizon:
            _, seq = order.popleft()
            if self._seen.get(seq, now) < horizon:
                del self._seen[seq]

    def __len__(self) -> int:
        return len(self._seen)

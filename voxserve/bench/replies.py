"""Timing of reply audio as a client receives it: first byte, gaps, playback underruns.

Shared by the assistant and tts WebSocket clients: the server frames each reply with
`tts.start` / `tts.end` and sends PCM16 chunks between them.
"""

from __future__ import annotations

from collections.abc import Callable

from voxserve.bench.records import Raw
from voxserve.bench.stats import gaps, underrun


def reply_began(
    raw: Raw,
    u: int | None,
    now: float,
    first_sent: dict[int, float],
    last_sent: dict[int, float],
    premature: set[int],
) -> bool:
    """A reply to utterance `u` began playing at `now`: its turn latency (from the last
    speech frame sent), or, while `u` is still being spoken (its speech began and has not
    ended: the speaker only paused), a premature turn, counted once per utterance
    (`premature_turns`; the step's premature_turn_rate). False when it matches none."""
    if u is None:
        return False
    if u in last_sent:
        raw.add("turn", now - last_sent[u])
        return True
    if u in first_sent:
        if u not in premature:
            premature.add(u)
            raw.counts["premature_turns"] += 1
        return True
    return False


class ReplyAudio:
    """Follows one session's replies; calls `on_first_audio(reply, t)` at each first chunk."""

    def __init__(self, raw: Raw, on_first_audio: Callable[[int, float], None]) -> None:
        self.raw = raw
        self.on_first_audio = on_first_audio
        self.reply: int | None = None
        self.rate = 16_000
        self.arrivals: list[float] = []
        self.durations: list[float] = []
        self.playback_end = 0.0  # when a real-time player would have played all audio

    def start(self, event: dict[str, object]) -> None:
        reply = event.get("reply")
        self.reply = reply if isinstance(reply, int) else -1
        rate = event.get("sample_rate")
        self.rate = rate if isinstance(rate, int) and rate > 0 else 16_000
        self.arrivals, self.durations = [], []

    def chunk(self, size: int, now: float) -> None:
        if self.reply is None:
            self.raw.counts["audio_outside_reply"] += 1
            return
        if not self.arrivals:
            self.on_first_audio(self.reply, now)
            self.playback_end = now
        duration = size / 2 / self.rate
        self.arrivals.append(now)
        self.durations.append(duration)
        self.playback_end = max(self.playback_end, now) + duration
        self.raw.counts["audio_chunks"] += 1
        self.raw.counts["audio_ms"] += round(duration * 1000)

    def end(self, event: dict[str, object]) -> None:
        if self.reply is None:
            return
        self.raw.counts["replies"] += 1
        if event.get("interrupted"):
            self.raw.counts["replies_interrupted"] += 1
        if self.arrivals:
            starved = underrun(self.arrivals, self.durations)
            self.raw.add("underrun", starved.starved_s)
            self.raw.counts["underrun_events"] += starved.events
            for gap in gaps(self.arrivals):
                self.raw.add("chunk_gap", gap)
        self.reply = None

"""Is TTS keeping up? Degraded means: serve only what is cached, refuse new syntheses.

Each new synthesis is admitted by predicted lateness first (`admit`, tts_lateness.py):
refused (`late`) only when its first audio, predicted from the measured service rate and
the work ahead of it in EDF order, would miss its budget (`first_audio_budget_ms` for a
live reply, `one_shot_first_audio_budget_ms` for a one-shot request). Then two signals,
kept from before as backstops:

The first-audio latency of misses, each against its class's budget (slow for
`sustained_s` in a row, at least `min_slow` of them: degraded) and the TTS stage's queue
(`max_waiting` callers already waiting: degraded at once, so its memory stays bounded).
A miss under budget recovers at once. Degraded syntheses are refused, so no new latencies
arrive; degraded therefore lasts `retry_after_s` after the last slow miss, then lets uncached
speech through again, and the next slow miss (the streak is still open) degrades at once:
a half-open circuit breaker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from voxserve.config import DegradeConfig
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.scheduling.tts_lateness import Prediction, ServiceRates, Ticket, TtsSchedule

log = logging.getLogger(__name__)


_WHY = {
    "queue": "its queue is full",
    "late": "this request's first audio would miss its deadline",
    "behind": "admitted, it would make the streams in progress pause",
}


class TtsDegraded(VoxError):
    """Raised by synthesis, before any audio, for uncached text while TTS is degraded."""

    def __init__(self, reason: str, retry_after_s: int) -> None:
        why = _WHY.get(reason, "first audio is over its budget")
        super().__init__(
            ErrorCode.TTS_DEGRADED,
            f"text-to-speech is saturated ({why}); only cached speech is served now",
            stage="tts",
            retry_after_s=retry_after_s,
        )
        self.reason = reason


class TtsHealth:
    def __init__(self, config: DegradeConfig, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.clock = clock
        self._budget_s = config.first_audio_budget_ms / 1000
        self._one_shot_budget_s = config.one_shot_first_audio_budget_ms / 1000
        self._streak_start: float | None = None  # first slow miss of the current run
        self._streak = 0
        self._last_slow = 0.0
        self._degraded = False
        self.fallbacks = 0  # replies that spoke the fallback phrase
        self.refusals: dict[str, int] = {}  # by reason: late, queue, slow
        rates = ServiceRates(config.ms_per_char / 1000, config.rate_smoothing)
        self.schedule = TtsSchedule(
            self._budget_s, rates, clock, self._one_shot_budget_s, continuity=config.continuity
        )

    def admit(
        self, ticket: Ticket, waiting: int, slots: int, *, live_apart: bool = False
    ) -> Prediction:
        """Raise TtsDegraded when `ticket`'s synthesis should not start: predicted to miss
        its first-audio deadline (over `slots`; `live_apart`: TtsSchedule.predict), or a
        backstop (`check`). The ticket is closed then. Returns the prediction (for the
        metrics) when admitted."""
        prediction = self.schedule.predict(ticket, slots, live_apart=live_apart)
        try:
            if self.config.enabled and self.config.predict and not prediction.fits:
                reason = "late" if prediction.late_s > 0 else "behind"
                self._refuse(reason, prediction.retry_after_s())
            self.check(waiting)
        except TtsDegraded:
            self.schedule.close(ticket)
            raise
        return prediction

    @property
    def refused(self) -> int:
        """Syntheses refused, for every reason."""
        return sum(self.refusals.values())

    def lateness_inputs(self) -> TtsSchedule:
        """What admission by predicted lateness reads (for the metrics)."""
        return self.schedule

    def observe_first_audio(self, seconds: float, *, one_shot: bool = False) -> None:
        """A miss's time to its first chunk (queueing for the stage included), judged by
        its class's configured budget (`one_shot`: a one-shot request's)."""
        now = self.clock()
        budget = self._one_shot_budget_s if one_shot else self._budget_s
        if seconds > budget:
            if self._streak_start is None:
                self._streak_start = now
            self._streak += 1
            self._last_slow = now
        else:
            self._streak_start = None
            self._streak = 0

    def reason(self, waiting: int) -> str | None:
        """Why TTS is degraded now ("queue" or "slow"), None if it is not."""
        cfg = self.config
        found: str | None = None
        if cfg.enabled:
            now = self.clock()
            if waiting >= cfg.max_waiting:
                found = "queue"
            elif (
                self._streak_start is not None
                and self._streak >= cfg.min_slow
                and self._last_slow - self._streak_start >= cfg.sustained_s
                and now - self._last_slow < cfg.retry_after_s
            ):
                found = "slow"
        if (found is not None) != self._degraded:
            self._degraded = found is not None
            log.warning("tts degraded" if found else "tts recovered", extra={"reason": found})
        return found

    def check(self, waiting: int) -> None:
        """Raise TtsDegraded when a new synthesis should not start."""
        found = self.reason(waiting)
        if found is not None:
            self._refuse(found, self.config.retry_after_s)

    def _refuse(self, reason: str, retry_after_s: int) -> None:
        self.refusals[reason] = self.refusals.get(reason, 0) + 1
        raise TtsDegraded(reason, retry_after_s)

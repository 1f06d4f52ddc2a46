"""Notices when the event loop is blocked, says where, and measures its lag.

One blocked loop stalls every session of the process at once (a model called on the loop
thread, a big JSON encode, a slow sync log handler). A heartbeat task on the loop records
when it last ran and how late each wake-up was (voxserve_event_loop_lag_seconds); a
watchdog thread checks the heartbeat and, when the loop has not run for longer than the
threshold, counts a stall (voxserve_event_loop_stalls_total) and logs the loop thread's
stack (sys._current_frames), once per stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
import traceback

from prometheus_client import Counter, Histogram

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.05  # how often the loop beats: 20 cheap wake-ups a second


class LoopWatchdog:
    def __init__(
        self,
        stalls: Counter,
        lag: Histogram,
        *,
        threshold_s: float = 0.1,
        beat_s: float = HEARTBEAT_S,
    ) -> None:
        self.threshold_s = threshold_s
        self.beat_s = min(beat_s, threshold_s / 2)
        self._stalls = stalls
        self._lag = lag
        self.stalls = 0  # also counted here for tests and /debug/stats
        self._last_beat = time.perf_counter()
        self._loop_thread: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start on the running loop (call from a coroutine on it)."""
        self._loop_thread = threading.get_ident()
        self._last_beat = time.perf_counter()
        self._stop.clear()
        self._task = asyncio.get_running_loop().create_task(
            self._beat(), name="voxserve-loop-heartbeat"
        )
        self._thread = threading.Thread(
            target=self._watch, name="voxserve-loop-watchdog", daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 1.0)

    async def _beat(self) -> None:
        beat = self.beat_s
        while True:
            due = time.perf_counter() + beat
            await asyncio.sleep(beat)
            now = time.perf_counter()
            self._last_beat = now
            self._lag.observe(max(0.0, now - due))

    def _watch(self) -> None:
        reported_beat = -1.0
        while not self._stop.wait(self.beat_s):
            last = self._last_beat
            blocked = time.perf_counter() - last
            if blocked <= self.threshold_s or last == reported_beat:
                continue
            reported_beat = last  # one report per stall, however long it lasts
            self.stalls += 1
            self._stalls.inc()
            log.warning(
                "event loop blocked",
                extra={"blocked_ms": round(blocked * 1000, 1), "stack": self._loop_stack()},
            )

    def _loop_stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread or -1)
        if frame is None:
            return "<loop thread not found>"
        return "".join(traceback.format_stack(frame)).rstrip()

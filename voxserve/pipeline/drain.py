"""Graceful drain: what SIGTERM does before the server stops.

Admission refuses new sessions at once (`shutting_down`, with a retry hint, so a client
reconnects to another instance) and /readyz turns 503 so load balancers stop sending; every
live session is asked to finish: its input is closed, its turn in progress completes (final
transcript, reply spoken) and it ends with `session.ended` reason `server_shutdown`. Sessions
still running at the deadline are ended the same way, cut short. Then the server exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

log = logging.getLogger(__name__)

FORCED_END_GRACE_S = 2.0  # after the deadline, how long forced sessions get to say goodbye


class Drainable(Protocol):
    """A live session of any transport, as the drain sees it."""

    def begin_drain(self) -> None:
        """Stop taking input; finish the turn in progress; end with server_shutdown."""
        ...

    def force_end(self) -> None:
        """End now (the drain deadline passed), still with server_shutdown."""
        ...


class Drain:
    def __init__(self) -> None:
        self.draining = False
        self._live: set[Drainable] = set()
        self._empty = asyncio.Event()
        self._empty.set()
        self.finished = 0  # sessions that completed their turn during the drain
        self.forced = 0  # sessions cut short at the deadline

    def add(self, session: Drainable) -> None:
        self._live.add(session)
        self._empty.clear()
        if self.draining:  # admitted just before the drain began
            session.begin_drain()

    def discard(self, session: Drainable) -> None:
        self._live.discard(session)
        if not self._live:
            self._empty.set()

    @property
    def live(self) -> int:
        return len(self._live)

    async def run(self, timeout_s: float) -> None:
        """Drain every live session, waiting at most `timeout_s` for them to finish."""
        self.draining = True
        started = time.monotonic()
        total = len(self._live)
        log.info("draining", extra={"sessions": total, "timeout_s": timeout_s})
        for session in list(self._live):
            session.begin_drain()
        if not await self._wait_empty(timeout_s):
            remaining = list(self._live)
            self.forced = len(remaining)
            for session in remaining:
                session.force_end()
            await self._wait_empty(FORCED_END_GRACE_S)
        self.finished = total - self.forced
        log.info(
            "drained",
            extra={
                "finished": self.finished,
                "forced": self.forced,
                "seconds": round(time.monotonic() - started, 3),
            },
        )

    async def _wait_empty(self, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                await self._empty.wait()
        except TimeoutError:
            return False
        return True

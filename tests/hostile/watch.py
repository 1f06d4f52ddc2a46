"""What an attack costs the others: the server's RSS and a live stream's lag, watched while
the attack runs (tests/hostile, one module per door).

`watched(http_url)` keeps one live `/v1/stream` ASR session at real-time pace beside the
attack: 20 ms frames of a spoken fixture, then silence, with a WebSocket ping every 100 ms.
A ping's round trip is answered by the server's event loop between frames, so it is the
lag a live stream sees: a decode, resample or model call run on the loop (the class these
tests guard) shows as seconds, a busy CPU as milliseconds. The RSS is sampled every 10 ms,
of the server's process (`pid`) or of this one (in-process test servers); past `abort_over`
the run ends at once (exit 3) instead of taking the machine down. On exit the live stream
ends, and `Watch` holds its figures and its events (the transcript must still arrive).
The watcher shares this process's loop and GIL: a flood whose client work is heavy is sent
from a child process (flood.py), or the lag measures the attacker's own client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.client import connect

from tests.helpers import fixture_audio
from tests.wsclient import frame_message, of_type

MB = 1_000_000
ABORT_OVER = 3_000 * MB
PING_EVERY_S = 0.1
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_of(pid: int) -> int:
    """The resident set of process `pid` in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


@dataclass
class Watch:
    """The figures of one watched attack."""

    rss_start: int = 0
    rss_peak: int = 0
    lags_s: list[float] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rss_growth_mb(self) -> float:
        return (self.rss_peak - self.rss_start) / MB

    def lag_ms(self, q: float) -> float:
        """The q-quantile (0-1) of the live stream's ping round trips, in ms."""
        if not self.lags_s:
            return float("inf")
        return float(np.quantile(np.array(self.lags_s), q)) * 1000

    def transcript(self) -> str:
        return " ".join(e["text"] for e in of_type(self.events, "transcript.final"))

    def assert_unhurt(self, max_growth_mb: float, max_p99_lag_ms: float = 250.0) -> None:
        """The guarantees every hostile test checks: memory bounded, the loop answering the
        live stream within `max_p99_lag_ms` (a blocking call on the loop takes seconds), and
        the live stream served to its end with its transcript."""
        assert self.rss_growth_mb <= max_growth_mb, f"RSS grew {self.rss_growth_mb:.0f} MB"
        assert self.lag_ms(0.99) <= max_p99_lag_ms, f"live P99 lag {self.lag_ms(0.99):.0f} ms"
        ended = of_type(self.events, "session.ended")
        assert ended, [e["type"] for e in self.events]
        assert self.transcript().strip(), self.events


class _RssSampler:
    def __init__(self, watch: Watch, pid: int, abort_over: int) -> None:
        self.watch, self.pid, self.abort_over = watch, pid, abort_over
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hostile-rss", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            rss = rss_of(self.pid)
            self.watch.rss_peak = max(self.watch.rss_peak, rss)
            if rss - self.watch.rss_start > self.abort_over:
                print(f"watch: RSS grew {(rss - self.watch.rss_start) // MB} MB", file=sys.stderr)
                os._exit(3)
            time.sleep(0.01)


async def _live_stream(
    ws_url: str, watch: Watch, stop: asyncio.Event, key: str | None = None
) -> None:
    """Speak one fixture at real-time pace, then silence until `stop`, pinging every 100 ms;
    then end the stream and read it out."""
    speech = fixture_audio("command.wav").astype(np.int16)  # int16 already
    frames = [speech[i : i + 320] for i in range(0, speech.size, 320)]
    silence = np.zeros(320, dtype=np.int16)
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with connect(ws_url, max_size=None, additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "asr"}))

        async def read() -> None:
            async for message in ws:
                if isinstance(message, str):
                    event = json.loads(message)
                    watch.events.append(event)
                    if event["type"] == "session.ended":
                        return

        reader = asyncio.create_task(read())
        start = time.monotonic()
        seq, next_ping = 0, start
        pongs: list[asyncio.Task[None]] = []
        while not stop.is_set() or seq < len(frames) + 50:
            await ws.send(frame_message(seq, frames[seq] if seq < len(frames) else silence))
            seq += 1
            now = time.monotonic()
            if now >= next_ping:
                next_ping = now + PING_EVERY_S
                pongs.append(asyncio.create_task(_round_trip(ws, watch)))
            await asyncio.sleep(max(0.0, start + seq * 0.02 - time.monotonic()))
        await ws.send(json.dumps({"type": "audio.end"}))
        async with asyncio.timeout(60):
            await reader
        for pong in pongs:
            pong.cancel()


async def _round_trip(ws: Any, watch: Watch) -> None:
    sent = time.monotonic()
    waiter = await ws.ping()
    await waiter
    watch.lags_s.append(time.monotonic() - sent)


@contextlib.asynccontextmanager
async def watched(
    http_url: str, pid: int | None = None, abort_over: int = ABORT_OVER, key: str | None = None
) -> AsyncIterator[Watch]:
    """`async with watched(live.http_url) as watch: <attack>` then `watch.assert_unhurt(...)`.
    `pid`: the server's process when it runs apart (default: this process); `key`: the API
    key the live stream connects with (a server with keys)."""
    watch = Watch()
    pid = pid or os.getpid()
    watch.rss_start = watch.rss_peak = rss_of(pid)
    sampler = _RssSampler(watch, pid, abort_over)
    sampler.thread.start()
    stop = asyncio.Event()
    ws_url = http_url.replace("http://", "ws://").replace("https://", "wss://") + "/v1/stream"
    live = asyncio.create_task(_live_stream(ws_url, watch, stop, key))
    await asyncio.sleep(0.3)  # the stream is live before the attack starts
    try:
        yield watch
    finally:
        stop.set()
        try:
            await live
        finally:
            sampler.stop.set()
            sampler.thread.join()
            watch.rss_peak = max(watch.rss_peak, rss_of(pid))

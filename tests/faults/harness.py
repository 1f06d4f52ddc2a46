"""What every fault test does: run healthy streams alongside the fault and check their
output, check that `session.ended` counters add up, and wait for the server's resources
(sessions, asyncio tasks, threads, open fds from /debug/stats) to come back to baseline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import numpy as np
from websockets.asyncio.client import connect

from tests.conftest import LiveServer
from tests.fakes import silence, tone, word_for
from tests.wsclient import collect, of_type, send_audio

ADMIN_KEY = "faults-admin-key"
HEALTHY_HZ = (400, 500, 600, 700)
T = TypeVar("T")


def utterances(*freqs: float) -> np.ndarray:
    """One 0.6 s tone per frequency, each followed by enough silence to end its segment."""
    parts = [np.concatenate([silence(0.2), tone(f, 0.6), silence(0.8)]) for f in freqs]
    return np.concatenate(parts)


def counters_add_up(ended: dict[str, Any], *, sent: int | None = None) -> None:
    """Nothing accepted is silently lost: every frame received is a duplicate or accepted,
    every accepted one processed (or counted as dropped), and with `sent` every message
    the client sent is received or rejected."""
    assert ended["received"] == ended["accepted"] + ended["duplicates"], ended
    assert ended["processed"] == ended["accepted"] - ended["dropped"], ended
    assert ended["dropped"] == 0, ended
    if sent is not None:
        assert ended["received"] + ended["rejected"] == sent, ended


async def asr_stream(live: LiveServer, *freqs: float, speedup: float = 5.0) -> list[dict[str, Any]]:
    """A whole asr session: the tones, audio.end, every event up to session.ended."""
    async with connect(live.ws_url) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "asr", "partials": False}))
        assert json.loads(await ws.recv())["type"] == "session.started"
        await send_audio(ws, utterances(*freqs), speedup=speedup)
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws, limit_s=30)
    return events


async def message_stream(live: LiveServer, messages: Iterable[bytes | str]) -> list[dict[str, Any]]:
    """An asr session fed `messages` as they are (frames, damaged or not), ten every 40 ms
    (5x real time for 20 ms frames), then audio.end; every event up to session.ended. The
    messages are read as they are sent: a generator can act between two of them."""
    async with connect(live.ws_url) as ws:
        await ws.send(json.dumps({"type": "session.start", "mode": "asr", "partials": False}))
        assert json.loads(await ws.recv())["type"] == "session.started"
        for n, message in enumerate(messages):
            await ws.send(message)
            if n % 10 == 9:
                await asyncio.sleep(0.04)
        await ws.send(json.dumps({"type": "audio.end"}))
        events, _ = await collect(ws)
    return events


def finals(events: list[dict[str, Any]]) -> list[str]:
    return [e["text"] for e in of_type(events, "transcript.final")]


async def healthy_stream(live: LiveServer, freq: float) -> None:
    """A stream that must be untouched by whatever else happens: two utterances, both
    recognised, no error, counters that add up."""
    events = await asr_stream(live, freq, freq + 50)
    assert finals(events) == [word_for(freq), word_for(freq + 50)], events
    assert not of_type(events, "error"), of_type(events, "error")
    counters_add_up(of_type(events, "session.ended")[0])


async def alongside(live: LiveServer, fault: Awaitable[T], streams: int = 4) -> T:
    """Run `fault` with `streams` healthy streams at the same time; its result."""
    healthy = [healthy_stream(live, HEALTHY_HZ[i % len(HEALTHY_HZ)]) for i in range(streams)]
    results = await asyncio.gather(fault, *healthy)
    return results[0]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Resources:
    sessions: int
    tasks: int
    threads: int
    fds: int
    fd_targets: frozenset[str]  # what the fds point at (the server is in this process)


def _fd_targets() -> frozenset[str]:
    """For the failure message only: which fds are new."""
    targets = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            targets.add(os.readlink(f"/proc/self/fd/{fd}"))
    return frozenset(targets)


def _describe(target: str) -> str:
    """A socket fd as its TCP ports (from /proc/net/tcp), to tell whose connection it is."""
    if not target.startswith("socket:["):
        return target
    inode = target[8:-1]
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in lines:
                fields = line.split()
                if len(fields) > 9 and fields[9] == inode:
                    local, remote = (int(f.split(":")[1], 16) for f in fields[1:3])
                    return f"tcp {local}->{remote}"
    return target


async def resources(live: LiveServer) -> Resources:
    async with httpx.AsyncClient() as http:
        response = await http.get(
            live.http_url + "/debug/stats", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )
    stats = response.json()
    process = stats["process"]
    return Resources(
        stats["sessions_active"],
        process["tasks"],
        process["threads"],
        process["fds"],
        _fd_targets(),
    )


async def back_to_baseline(live: LiveServer, baseline: Resources, within_s: float = 5.0) -> None:
    """Sessions, tasks, threads and fds return to (at most) what they were before."""
    now = await resources(live)
    for _ in range(int(within_s / 0.05)):
        if (
            now.sessions == 0
            and now.tasks <= baseline.tasks
            and now.threads <= baseline.threads
            and now.fds <= baseline.fds
        ):
            return
        await asyncio.sleep(0.05)
        now = await resources(live)
    new_fds = [_describe(t) for t in sorted(now.fd_targets - baseline.fd_targets)]
    raise AssertionError(
        f"resources did not return to baseline: {now.sessions} sessions, {now.tasks} tasks, "
        f"{now.threads} threads, {now.fds} fds (before: {baseline.tasks} tasks, "
        f"{baseline.threads} threads, {baseline.fds} fds); new fds: {new_fds}"
    )

"""The server process as the kernel sees it: CPU, RSS, threads, open fds, context switches,
read from /proc (Linux), plus the whole machine's CPU so noise from other work shows.

The process is given by pid, or found by the port it listens on: /proc/net/tcp{,6} maps the
port to a socket inode, and the process holding that inode among its fds is the server.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
LISTEN = "0A"


@dataclass(frozen=True, slots=True)
class Snapshot:
    t: float
    cpu_s: float  # user + system, all threads
    rss_bytes: int
    threads: int
    fds: int
    voluntary: int  # context switches, summed over threads
    involuntary: int
    machine_busy: float  # /proc/stat jiffies not idle, all cores
    machine_total: float


def _machine() -> tuple[float, float]:
    fields = [float(x) for x in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


def snapshot(pid: int) -> Snapshot:
    base = PROC / str(pid)
    stat = (base / "stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICKS
    threads = int(fields[17])
    rss = int(fields[21]) * PAGE
    voluntary = involuntary = 0
    for task in (base / "task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    voluntary += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    involuntary += int(line.split()[1])
        except OSError:
            continue  # the thread ended meanwhile
    fds = len(os.listdir(base / "fd"))
    busy, total = _machine()
    return Snapshot(time.monotonic(), cpu, rss, threads, fds, voluntary, involuntary, busy, total)


def pin(pid: int, core: int = 0) -> None:
    """Every thread of process `pid` on `core` (threads it starts later inherit it)."""
    for tid in os.listdir(PROC / str(pid) / "task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), {core})


def pin_servers(*pids: int | None) -> None:
    """Both servers on core 0, this process (and the load processes it starts) on the
    others: each server then has one core to itself and the client never shares it, so
    the two are measured under the same placement (--pin)."""
    cores = os.cpu_count() or 1
    if cores < 2:
        raise SystemExit("bench: --pin needs two cores or more")
    for pid in pids:
        if pid is None:
            raise SystemExit("bench: --pin needs the server's pid (--spawn or a local server)")
        pin(pid, 0)
    os.sched_setaffinity(0, set(range(1, cores)))


def listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state == LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def pid_listening_on(port: int) -> int | None:
    """The process with a listening socket on `port`, or None (not found or no access)."""
    wanted = {f"socket:[{inode}]" for inode in listening_inodes(port)}
    if not wanted:
        return None
    for entry in PROC.iterdir():
        if entry.name.isdigit() and any(link in wanted for link in _fd_links(entry)):
            return int(entry.name)
    return None


def _fd_links(proc: Path) -> Iterator[str]:
    """What a process's fds point to; fds closed meanwhile (or not ours to read) are skipped."""
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:
        return
    for fd in fds:
        with contextlib.suppress(OSError):
            yield os.readlink(fd)


def between(a: Snapshot, b: Snapshot) -> dict[str, Any]:
    """Rates over the window from a to b (cpu_percent: 100 = one core)."""
    wall = max(b.t - a.t, 1e-9)
    machine = b.machine_total - a.machine_total
    return {
        "cpu_percent": round(100 * (b.cpu_s - a.cpu_s) / wall, 1),
        "ctx_voluntary_per_s": round((b.voluntary - a.voluntary) / wall, 1),
        "ctx_involuntary_per_s": round((b.involuntary - a.involuntary) / wall, 1),
        "machine_cpu_percent": round(
            100 * (b.machine_busy - a.machine_busy) / machine * (os.cpu_count() or 1), 1
        )
        if machine
        else None,
        "window_s": round(wall, 3),
    }


class Sampler:
    """Samples a pid in a thread between two monotonic times; `summary()` after `join()`."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.snaps: list[Snapshot] = []
        self.error: str | None = None
        self._thread: threading.Thread | None = None

    def start(self, begin: float, end: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(begin, end), daemon=True)
        self._thread.start()

    def _run(self, begin: float, end: float) -> None:
        time.sleep(max(0.0, begin - time.monotonic()))
        while True:
            try:
                self.snaps.append(snapshot(self.pid))
            except (OSError, ValueError, IndexError) as exc:
                self.error = f"cannot read /proc/{self.pid}: {exc}"
                return
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(self.interval_s, left))

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pid": self.pid}
        if self.error:
            out["error"] = self.error
        if len(self.snaps) < 2:
            return out
        first, last = self.snaps[0], self.snaps[-1]
        out |= between(first, last)
        out["rss_mb_start"] = round(first.rss_bytes / 2**20, 1)
        out["rss_mb_max"] = round(max(s.rss_bytes for s in self.snaps) / 2**20, 1)
        out["threads_max"] = max(s.threads for s in self.snaps)
        out["fds_max"] = max(s.fds for s in self.snaps)
        return out

"""A process's memory and the ceiling it lives under (Linux; 0 or {} elsewhere): read by the
metrics at scrape time, by the memory guard (pipeline/scheduling/memory_guard.py) before new work,
by GET /debug/memory and by the memory benchmarks (bench/memory.py, of another process); and
this process's threads and open files, for the debug endpoints' leak checks."""

from __future__ import annotations

import os

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def rss_bytes() -> int:
    """The resident set size, from /proc/self/statm (one small read, a few microseconds)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def memory_limit_bytes() -> int:
    """The cgroup (container) memory limit, v2 or v1; 0 when there is none."""
    for path in _CGROUP_LIMITS:
        try:
            with open(path, encoding="ascii") as limit:
                text = limit.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 writes a huge number for none
            return int(text)
        return 0
    return 0


def machine_memory_bytes() -> int:
    """The machine's memory (MemTotal of /proc/meminfo); 0 when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


def process_stats() -> dict[str, int]:
    """Threads and open fds of this process (Linux /proc; -1 elsewhere), for leak checks."""
    try:
        fds = len(os.listdir("/proc/self/fd"))
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        return {"threads": -1, "fds": -1}
    return {"threads": threads, "fds": fds}


_ROLLUP = {"Rss": "rss", "Pss": "pss", "Private_Clean": "private", "Private_Dirty": "private"}


def smaps_rollup(pid: int | str = "self") -> dict[str, int]:
    """RSS, PSS and USS (private pages) in bytes from /proc/PID/smaps_rollup: PSS and USS
    are the honest figures when pages are shared between worker processes. {} elsewhere."""
    found = {"rss": 0, "pss": 0, "private": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
            for line in rollup:
                name, _, rest = line.partition(":")
                key = _ROLLUP.get(name)
                if key is not None:
                    found[key] += int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return {"rss_bytes": found["rss"], "pss_bytes": found["pss"], "uss_bytes": found["private"]}

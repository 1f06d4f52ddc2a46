"""This process's memory and the ceiling it lives under (Linux; 0 elsewhere): read by the
metrics at scrape time and by the memory guard (pipeline/memory_guard.py) before new work;
and its threads and open files, for the debug endpoints' leak checks."""

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

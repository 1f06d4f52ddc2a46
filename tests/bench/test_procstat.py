"""/proc sampling of a process, and finding the process that listens on a port."""

from __future__ import annotations

import os
import socket
import time

from voxserve.bench.procstat import Sampler, between, pid_listening_on, snapshot


def test_snapshot_of_this_process() -> None:
    snap = snapshot(os.getpid())
    assert snap.rss_bytes > 10 * 2**20
    assert snap.threads >= 1 and snap.fds >= 3
    assert snap.voluntary + snap.involuntary > 0


def test_cpu_percent_over_a_window() -> None:
    first = snapshot(os.getpid())
    end = time.thread_time() + 0.1
    while time.thread_time() < end:
        pass
    rates = between(first, snapshot(os.getpid()))
    assert rates["cpu_percent"] > 30


def test_finds_the_listening_process_by_port() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert pid_listening_on(sock.getsockname()[1]) == os.getpid()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound but not listening
        assert pid_listening_on(sock.getsockname()[1]) is None


def test_sampler_summary() -> None:
    sampler = Sampler(os.getpid(), interval_s=0.05)
    now = time.monotonic()
    sampler.start(now, now + 0.2)
    sampler.join(timeout=2)
    summary = sampler.summary()
    assert summary["rss_mb_max"] > 10 and summary["threads_max"] >= 2 and "cpu_percent" in summary

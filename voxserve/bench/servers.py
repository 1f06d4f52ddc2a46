"""Servers the tool starts itself, in subprocesses on free loopback ports, always stopped:
voxserve (`--spawn`) and the baseline echo server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import httpx

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def ws_url(url: str) -> str:
    """ws://HOST:PORT with or without a path -> the /v1/stream endpoint."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"--url must look like ws://HOST:PORT, not {url!r}")
    path = parts.path if parts.path not in ("", "/") else "/v1/stream"
    return f"{parts.scheme}://{parts.netloc}{path}"


def realtime_url(url: str, model: str) -> str:
    """ws://HOST:PORT[/any path] -> the OpenAI Realtime endpoint with its model query."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/v1/realtime?{urlencode({'model': model})}"


def http_base(url: str) -> str:
    parts = urlsplit(url)
    scheme = "https" if parts.scheme == "wss" else "http"
    return f"{scheme}://{parts.netloc}"


def port_of(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme in ("wss", "https") else 80)


@dataclass(frozen=True)
class Spawned:
    url: str  # ws://127.0.0.1:PORT/v1/stream
    pid: int


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def wait_until(
    ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout_s: float
) -> None:
    """Poll `ready` (an OSError or HTTP error counts as not yet) until it holds; a
    RuntimeError with the log's tail if `proc` exits first, TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"the spawned server exited with {proc.returncode}:\n{tail}")
        with contextlib.suppress(OSError, httpx.HTTPError):
            if ready():
                return
        time.sleep(0.2)
    raise TimeoutError(f"the spawned server was not ready within {timeout_s:g} s (log: {log})")


@contextlib.contextmanager
def spawn_voxserve(
    log: Path,
    config: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 180,
) -> Iterator[Spawned]:
    """`python -m voxserve serve` on a free port, ready (/readyz 200) when this yields."""
    port = free_port()
    cmd = [sys.executable, "-m", "voxserve", "serve", "--host", HOST, "--port", str(port)]
    cmd += ["--log-level", "warning"] + (["--config", config] if config else [])
    # Only the WebSocket/HTTP port is measured; other transports stay off unless the run's
    # --server-env turns them on (their default ports would clash between spawned servers).
    env = {"VOXSERVE_GRPC_PORT": "0", "VOXSERVE_WYOMING_PORT": "0", **(env or {})}
    with running(cmd, log, env) as proc:
        base = f"http://{HOST}:{port}"
        wait_until(
            lambda: httpx.get(f"{base}/readyz", timeout=1).status_code == 200, proc, log, timeout_s
        )
        yield Spawned(f"ws://{HOST}:{port}/v1/stream", proc.pid)


@contextlib.contextmanager
def spawn_tcp(cmd: list[str], port: int, log: Path, timeout_s: float = 90) -> Iterator[int]:
    """Another program's server (a peer to compare with) listening on TCP `port`: its pid
    once the port accepts connections; stopped on exit."""

    def accepts() -> bool:
        socket.create_connection((HOST, port), timeout=1).close()
        return True

    with running(cmd, log, None) as proc:
        wait_until(accepts, proc, log, timeout_s)
        yield proc.pid


@contextlib.contextmanager
def spawn_echo(log: Path, timeout_s: float = 30, *, loop: str = "asyncio") -> Iterator[Spawned]:
    """The baseline echo server on a free port, on asyncio's own loop or uvloop."""
    port = free_port()
    cmd = [sys.executable, "-m", "voxserve.bench.echo_server", "--port", str(port), "--loop", loop]
    with running(cmd, log, None) as proc:

        def ready() -> bool:
            with socket.create_connection((HOST, port), timeout=1):
                return True

        wait_until(ready, proc, log, timeout_s)
        yield Spawned(f"ws://{HOST}:{port}/v1/stream", proc.pid)


@contextlib.contextmanager
def running(
    cmd: list[str], log: Path, env: Mapping[str, str] | None
) -> Iterator[subprocess.Popen[bytes]]:
    """`cmd` with its output appended to `log`, `env` over this process's; stopped on exit
    (SIGINT, then SIGKILL after 10 s)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    try:
        yield proc
    finally:
        _stop(proc)

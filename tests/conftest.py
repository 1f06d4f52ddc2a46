"""Shared fixtures: a real voxserve server on a free loopback port, with the real engines."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn

from voxserve.config import Settings, load_settings
from voxserve.runtime import Runtime
from voxserve.server.serve import uvicorn_config


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class LiveServer:
    settings: Settings
    runtime: Runtime
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.settings.port}/v1/stream"


def start_server(
    settings: Settings, runtime: Runtime | None = None, timeout: float = 90.0
) -> LiveServer:
    """Start uvicorn in a thread and wait until /readyz says the models are loaded."""
    runtime = runtime or Runtime(settings)
    server = uvicorn.Server(uvicorn_config(settings, runtime))
    thread = threading.Thread(target=server.run, name="voxserve-test-server", daemon=True)
    thread.start()
    live = LiveServer(settings, runtime, server, thread)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{live.http_url}/readyz", timeout=1.0).status_code == 200:
                return live
        except httpx.HTTPError:
            pass
        if runtime.load_error:
            raise RuntimeError(f"server failed to load engines: {runtime.load_error}")
        time.sleep(0.1)
    raise TimeoutError("server did not become ready")


def stop_server(live: LiveServer) -> None:
    live.server.should_exit = True
    live.thread.join(timeout=10)


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    """One real server with the default engines for the whole test session."""
    settings = load_settings(port=free_port(), log_level="warning")
    live = start_server(settings)
    yield live
    stop_server(live)

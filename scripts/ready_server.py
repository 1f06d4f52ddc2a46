"""`voxserve serve` from a checkout, for the scripts that measure one: started on a port,
yielded once /readyz answers 200 (or after 300 s, to show what the server does then),
killed after. Its output goes to this console."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import httpx


@contextmanager
def ready_server(
    root: str, port: int, env: Mapping[str, str], *flags: str
) -> Iterator[subprocess.Popen[bytes]]:
    """The server from checkout `root` (its cwd; PYTHONPATH is the caller's `env`) on
    `port`, gRPC off, `flags` after."""
    serve = [sys.executable, "-m", "voxserve", "serve", "--port", str(port), "--grpc-port", "0"]
    server = subprocess.Popen([*serve, *flags], env=dict(env), cwd=root)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield server
    finally:
        server.kill()
        server.wait()

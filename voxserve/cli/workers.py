"""`voxserve serve --workers N`: what the serve command does differently with workers
(server/workers.py forks and supervises them)."""

from __future__ import annotations

import socket
import sys
from typing import TYPE_CHECKING, Any

from voxserve.cli.errors import EXIT_OK, PROG

if TYPE_CHECKING:
    from voxserve.config import Settings


def workers_transports(settings: Settings) -> Settings:
    """With several workers only HTTP/WebSocket is served: gRPC and Wyoming bind their own
    ports in each worker's lifespan, which would collide (one worker for them)."""
    if settings.workers <= 1 or not (settings.grpc_port or settings.wyoming_port):
        return settings
    print(
        f"{PROG}: --workers {settings.workers}: gRPC and Wyoming are off (serve them from a "
        "one-worker server)",
        file=sys.stderr,
        flush=True,
    )
    return settings.model_copy(update={"grpc_port": 0, "wyoming_port": 0})


def run_workers(settings: Settings, sockets: list[socket.socket]) -> int:
    """Preload the fork-safe engines, fork the workers, supervise them until stopped."""
    from voxserve.server.workers import serve_workers

    def worker(worker_settings: Settings, preloaded: dict[str, Any], index: int) -> int:
        from voxserve.cli.signals import sigterm_interrupts
        from voxserve.runtime import Runtime
        from voxserve.server.serve import serve

        with sigterm_interrupts():
            try:
                serve(worker_settings, Runtime(worker_settings, preloaded=preloaded), sockets)
            except KeyboardInterrupt:  # uvicorn re-raises the signal after its shutdown
                pass
            except SystemExit as exc:
                return 0 if exc.code in (0, None) else 1
        return EXIT_OK

    return serve_workers(settings, settings.workers, sockets, worker)

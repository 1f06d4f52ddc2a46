"""Run the app under uvicorn with the transport limits from the settings."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.server import HANDLED_SIGNALS

from voxserve.config import Settings
from voxserve.runtime import Runtime
from voxserve.server.app import create_app
from voxserve.server.http.protocol import (
    ConnectionLimits,
    default_max_connections,
    http_protocol,
)
from voxserve.server.websocket.fastpath import websocket_protocol

KEEPALIVE_S = 20.0  # WebSocket ping interval, and at least the time a pong may take


def uvicorn_config(settings: Settings, runtime: Runtime | None = None) -> uvicorn.Config:
    runtime = runtime or Runtime(settings)
    limits = settings.limits
    return uvicorn.Config(
        create_app(runtime),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # logging is voxserve's (observe/logs.py), uvicorn's loggers included
        # uvicorn's httptools protocol + header timeout, connection cap, unread responses
        http=http_protocol(connection_limits(settings, runtime)),
        ws=websocket_protocol(),  # uvicorn's websockets-sansio + the audio fast path
        ws_max_size=limits.max_message_bytes,
        # PCM does not compress; deflate would only cost CPU on both ends.
        ws_per_message_deflate=False,
        ws_ping_interval=KEEPALIVE_S,
        # A client that stops reading is ended as `client_stalled` within 4/3 of
        # stalled_client_s (server/websocket/stall.py), not first by the keepalive.
        ws_ping_timeout=max(KEEPALIVE_S, limits.stalled_client_s * 4 / 3 + 2.0),
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        # TLS is shared with gRPC (settings.tls_*): HTTPS and WSS on the same port.
        ssl_certfile=settings.tls_cert_file,
        ssl_keyfile=settings.tls_key_file,
    )


def connection_limits(settings: Settings, runtime: Runtime) -> ConnectionLimits:
    limits = settings.limits
    metrics = runtime.metrics
    return ConnectionLimits(
        max_connections=limits.max_connections or default_max_connections(),
        header_timeout_s=limits.http_header_timeout_s,
        stalled_s=limits.stalled_client_s,
        count_closed=lambda reason: metrics.http_closed.labels(reason).inc(),
        count_error=lambda code: metrics.errors.labels(code.value, "http").inc(),
    )


class DrainingServer(uvicorn.Server):
    """uvicorn, except that the first SIGTERM or SIGINT drains the live sessions
    (pipeline/drain.py: new sessions refused, turns finished, `session.ended` reason
    `server_shutdown`) before uvicorn's own shutdown. A second signal skips what is left
    of the drain; the signal is re-raised after shutdown as uvicorn does (exit 0)."""

    def __init__(self, config: uvicorn.Config, runtime: Runtime) -> None:
        super().__init__(config)
        self.runtime = runtime
        runtime.on_fatal = self._stop  # a bad engine option found while loading
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None
        self._handlers: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, except at its end: uvicorn puts the handlers it found back and raises
        the signals it caught again inside the event loop, where the handler found (the
        CLI's: KeyboardInterrupt, cli/signals.py) could run while uvloop was closing, and the
        loop's teardown failed ("Cannot close a running event loop", a traceback from a
        worker of `serve --workers 2` stopped with the others). Here a signal is only noted
        until the loop is closed; `serve` then puts the handlers back and raises them."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        for sig in HANDLED_SIGNALS:
            self._handlers.setdefault(sig, signal.signal(sig, self.handle_exit))
        try:
            yield
        finally:
            for sig in HANDLED_SIGNALS:
                signal.signal(sig, self._note)

    def _note(self, sig: int, frame: FrameType | None) -> None:
        self._captured_signals.append(sig)

    def restore_signals(self) -> list[int]:
        """Put back the handlers found (the loop is closed); the signals caught, to raise."""
        for sig, handler in self._handlers.items():
            signal.signal(sig, handler)
        self._handlers.clear()
        caught, self._captured_signals = list(self._captured_signals), []
        return caught

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def _stop(self) -> None:
        """Stop without draining (nothing was served: the engines never loaded)."""
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain is None and self._loop is not None and not self.should_exit:
            self._captured_signals.append(sig)
            # A signal handler runs between bytecodes: hand the drain to the loop.
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(
                self._drain_then_exit(), name="voxserve-drain"
            )

    async def _drain_then_exit(self) -> None:
        try:
            await self.runtime.drain.run(self.runtime.settings.limits.drain_timeout_s)
        finally:
            self.should_exit = True


def serve(
    settings: Settings,
    runtime: Runtime | None = None,
    sockets: list[socket.socket] | None = None,
) -> None:
    """Serve until stopped; `sockets` may be bound beforehand (so a busy port is reported
    before anything loads, and port 0 works). Raises the configuration error the engines'
    loading stopped the server for (EngineConfigError: the CLI's one line, exit 2)."""
    runtime = runtime or Runtime(settings)
    server = DrainingServer(uvicorn_config(settings, runtime), runtime)
    try:
        server.run(sockets=sockets)
    finally:
        caught = server.restore_signals()
    for sig in reversed(caught):  # as uvicorn does (last first), once the loop is closed
        signal.raise_signal(sig)
    if runtime.fatal is not None:  # the server stopped for it (Runtime.stop_for)
        raise runtime.fatal

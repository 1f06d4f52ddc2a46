"""The Wyoming server: a TCP port in the HTTP server's event loop, one WyomingHandler per
connection, sharing the Runtime (and so the engines and stage limits) with every transport.
Plain TCP: Home Assistant's Wyoming client does not speak TLS."""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from wyoming.server import AsyncTcpServer

from voxserve.runtime import Runtime
from voxserve.server.wyoming_handler import WyomingHandler

log = logging.getLogger(__name__)


class WyomingTransport:
    """Start and stop the server; `port` is the bound port once started."""

    def __init__(self, runtime: Runtime, port: int) -> None:
        self.runtime = runtime
        self.requested_port = port
        self.port = 0
        self._server: AsyncTcpServer | None = None

    async def start(self) -> None:
        host = self.runtime.settings.host or "0.0.0.0"
        server = AsyncTcpServer(host, self.requested_port)
        await server.start(partial(self._handler, self.runtime))
        bound = server._server  # the package keeps the asyncio server private
        sockets = bound.sockets if isinstance(bound, asyncio.Server) else ()
        self.port = sockets[0].getsockname()[1] if sockets else self.requested_port
        self._server = server
        log.info("wyoming listening", extra={"port": self.port})

    @staticmethod
    def _handler(
        runtime: Runtime, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> WyomingHandler:
        return WyomingHandler(runtime, reader, writer)

    async def stop(self) -> None:
        """Close the port and every open connection (their requests end with them)."""
        if self._server is not None:
            await self._server.stop()
            self._server = None

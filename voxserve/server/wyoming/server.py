"""The Wyoming server: a TCP port in the HTTP server's event loop, one WyomingHandler per
connection, sharing the Runtime (and so the engines and stage limits) with every transport.
Plain TCP: Home Assistant's Wyoming client does not speak TLS. Advertised over zeroconf
(`wyoming.zeroconf`, server/wyoming/zeroconf.py) once bound and the engines are loaded,
withdrawn at stop."""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from wyoming.server import AsyncTcpServer

from voxserve.runtime import Runtime
from voxserve.server.wyoming.handler import WyomingHandler
from voxserve.server.wyoming.zeroconf import WyomingAdvertiser, default_name

log = logging.getLogger(__name__)


class WyomingTransport:
    """Start and stop the server; `port` is the bound port once started."""

    def __init__(self, runtime: Runtime, port: int) -> None:
        self.runtime = runtime
        self.requested_port = port
        self.port = 0
        self._server: AsyncTcpServer | None = None
        self.advertiser: WyomingAdvertiser | None = None

    async def start(self) -> None:
        host = self.runtime.settings.host or "0.0.0.0"
        server = AsyncTcpServer(host, self.requested_port)
        await server.start(partial(self._handler, self.runtime))
        bound = server._server  # the package keeps the asyncio server private
        sockets = bound.sockets if isinstance(bound, asyncio.Server) else ()
        self.port = sockets[0].getsockname()[1] if sockets else self.requested_port
        self._server = server
        log.info("wyoming listening", extra={"port": self.port})
        wyoming = self.runtime.settings.wyoming
        if wyoming.zeroconf:
            name = wyoming.zeroconf_name or default_name()
            self.advertiser = WyomingAdvertiser(name, host, self.port)
            self.advertiser.start(after=self.runtime.loaded)  # `describe` answers then

    @staticmethod
    def _handler(
        runtime: Runtime, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> WyomingHandler:
        return WyomingHandler(runtime, reader, writer)

    async def stop(self) -> None:
        """Withdraw the zeroconf record, then close the port and every open connection
        (their requests end with them)."""
        if self.advertiser is not None:
            await self.advertiser.stop()
            self.advertiser = None
        if self._server is not None:
            await self._server.stop()
            self._server = None

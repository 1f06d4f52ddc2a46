"""The transports that run beside HTTP/WebSocket in the same process and event loop: gRPC
(`grpc_port`) and Wyoming (`wyoming_port`); 0 disables either.

Started and stopped by the app's lifespan (server/app.py), so they share the Runtime and
the loop with uvicorn, are up before the server reports started, and stop before the
engines are closed. Their packages (the `grpc` extra) are imported only when a port is set:
`pip install -e .` without the extra still serves HTTP and the WebSocket.
"""

from __future__ import annotations

import logging
import ssl
from typing import Protocol

from voxserve.config import ConfigError, Settings
from voxserve.runtime import Runtime
from voxserve.server.session.auth import check_auth_settings

log = logging.getLogger(__name__)

EXTRA_HINT = "pip install -e '.[grpc]'"


class TransportUnavailable(ConfigError):
    """A transport is configured but its packages are not installed."""


class _Transport(Protocol):
    port: int

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def check_transport_packages(settings: Settings) -> None:
    """Import what the configured transports need, or say what to install (one line)."""
    wanted = [
        ("gRPC", "grpc_port", settings.grpc_port, "voxserve.server.grpc.server"),
        ("Wyoming", "wyoming_port", settings.wyoming_port, "voxserve.server.wyoming.server"),
    ]
    for name, key, port, module in wanted:
        if not port:
            continue
        try:
            __import__(module)
        except ImportError as exc:
            flag = "--" + key.replace("_", "-")
            raise TransportUnavailable(
                f"the {name} transport needs packages that are not installed ({exc}); "
                f"install them with {EXTRA_HINT}, or disable it with {flag} 0"
            ) from exc


def check_tls(settings: Settings) -> None:
    """Both TLS files or neither, and readable, before anything binds."""
    cert, key = settings.tls_cert_file, settings.tls_key_file
    if (cert is None) != (key is None):
        raise ConfigError("TLS needs both a certificate and a key (--tls-cert and --tls-key)")
    for path in (cert, key):
        if path is not None and not path.is_file():
            raise ConfigError(f"TLS file {path} does not exist or is not a file")
    if cert is not None and key is not None:
        try:  # a file that is not a PEM certificate and its key failed after "listening on"
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"TLS certificate {cert} and key {key} do not load as a PEM pair: {exc}"
            ) from exc


class Transports:
    """The extra servers of one process; `grpc_port` / `wyoming_port` once started (0 when
    disabled)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._started: list[_Transport] = []
        self.grpc_port = 0
        self.wyoming_port = 0

    async def start(self) -> None:
        settings = self.runtime.settings
        check_tls(settings)
        check_transport_packages(settings)
        check_auth_settings(settings)  # e.g. Wyoming (no keys) on a non-loopback host
        try:
            if settings.grpc_port:
                from voxserve.server.grpc.server import GrpcTransport

                grpc_server = GrpcTransport(self.runtime, settings.grpc_port)
                await grpc_server.start()
                self._started.append(grpc_server)
                self.grpc_port = grpc_server.port
            if settings.wyoming_port:
                from voxserve.server.wyoming.server import WyomingTransport

                wyoming = WyomingTransport(self.runtime, settings.wyoming_port)
                await wyoming.start()
                self._started.append(wyoming)
                self.wyoming_port = wyoming.port
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop in reverse order; one failing does not keep the others running."""
        while self._started:
            transport = self._started.pop()
            try:
                await transport.stop()
            except Exception:
                log.exception("transport did not stop cleanly")

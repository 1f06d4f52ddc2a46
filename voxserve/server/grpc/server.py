"""The gRPC server: voxserve.v1.Voxserve, the standard health service and server reflection,
on its own port, in the event loop (and with the Runtime) of the HTTP server.

Health follows /readyz: NOT_SERVING while the models load (or failed to), SERVING once
they are loaded, for the whole server ("") and for voxserve.v1.Voxserve.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from voxserve.config import Settings
from voxserve.runtime import Runtime
from voxserve.server.grpc.auth import AuthInterceptor
from voxserve.server.grpc.codec import request_decoder
from voxserve.server.grpc.service import VoxserveServicer
from voxserve.server.session.auth import KeyRing
from voxserve.v1 import voxserve_pb2 as pb

log = logging.getLogger(__name__)

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["Voxserve"].full_name  # voxserve.v1.Voxserve
KEEPALIVE_MS = 20_000  # as the WebSocket's ping interval and timeout
# A call's request metadata (the key, a client's own keys): grpc's soft default, also as the
# hard bound, so more is always RESOURCE_EXHAUSTED (grpc's, before voxserve sees the call),
# never refused by chance between the two as grpc does by default.
MAX_METADATA_BYTES = 8 * 1024


class GrpcBindError(OSError):
    """The gRPC port could not be bound (in use, or no such address)."""


def server_options(settings: Settings) -> list[tuple[str, Any]]:
    """Channel options: the WebSocket's message limit, keepalive pings, and no SO_REUSEPORT
    (grpc's default), so a port already in use is an error instead of a shared port."""
    return [
        ("grpc.max_receive_message_length", settings.limits.max_message_bytes),
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_MS),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
    ]


_HANDLERS: dict[tuple[bool, bool], Any] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def add_servicer(servicer: VoxserveServicer, server: grpc.aio.Server) -> None:
    """What the generated `add_VoxserveServicer_to_server` does, read from the proto's
    service descriptor, but with request deserializers that never raise
    (grpc_codec.request_decoder): bytes that are not a message reach the servicer, which
    refuses them with INVALID_ARGUMENT `invalid_message` (grpc's own answer was UNKNOWN
    "Unexpected DecodeError", without a voxserve code)."""
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["Voxserve"].methods:
        request_type = getattr(pb, method.input_type.name)
        response_type = getattr(pb, method.output_type.name)
        handler = _HANDLERS[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = handler(
            getattr(servicer, method.name),
            request_deserializer=request_decoder(request_type),
            response_serializer=response_type.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def address(host: str, port: int) -> str:
    """host:port as grpc writes it (IPv6 literals in brackets; "" = all interfaces)."""
    host = host or "0.0.0.0"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def server_credentials(cert_file: Path, key_file: Path) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(key_file.read_bytes(), cert_file.read_bytes())])


class GrpcTransport:
    """Start, serve and stop the gRPC server; `port` is the bound port once started."""

    def __init__(self, runtime: Runtime, port: int) -> None:
        self.runtime = runtime
        self.requested_port = port
        self.port = 0
        self.tls = False
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        settings = self.runtime.settings
        interceptors = [AuthInterceptor(KeyRing.from_settings(settings))]
        server = grpc.aio.server(options=server_options(settings), interceptors=interceptors)
        add_servicer(VoxserveServicer(self.runtime), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        where = address(settings.host, self.requested_port)
        try:
            if settings.tls_cert_file and settings.tls_key_file:
                creds = server_credentials(settings.tls_cert_file, settings.tls_key_file)
                self.port = server.add_secure_port(where, creds)
                self.tls = True
            else:
                self.port = server.add_insecure_port(where)
        except RuntimeError as exc:  # grpc's "Failed to bind to address"
            raise GrpcBindError(f"cannot listen for gRPC on {where}: {exc}") from exc
        if not self.port:
            raise GrpcBindError(f"cannot listen for gRPC on {where}")
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        self._server = server
        self._watch = asyncio.create_task(self._watch_ready(), name="voxserve-grpc-health")
        log.info("grpc listening", extra={"port": self.port, "tls": self.tls})

    async def stop(self, grace_s: float = 2.0) -> None:
        """Refuse new calls, give running ones `grace_s`, then cancel them."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._server is not None:
            await self._health.enter_graceful_shutdown()
            await self._server.stop(grace_s)
            self._server = None

    async def _watch_ready(self) -> None:
        await self.runtime.loaded.wait()
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)

    async def _set_health(self, status: int) -> None:
        for name in ("", SERVICE_NAME):
            await self._health.set(name, status)

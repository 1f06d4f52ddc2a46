"""Run the app under uvicorn with the transport limits from the settings."""

from __future__ import annotations

import socket

import uvicorn

from voxserve.config import Settings
from voxserve.runtime import Runtime
from voxserve.server.app import create_app


def uvicorn_config(settings: Settings, runtime: Runtime | None = None) -> uvicorn.Config:
    runtime = runtime or Runtime(settings)
    return uvicorn.Config(
        create_app(runtime),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # logging is voxserve's (observe/logs.py), uvicorn's loggers included
        ws="websockets-sansio",
        ws_max_size=settings.limits.max_message_bytes,
        # PCM does not compress; deflate would only cost CPU on both ends.
        ws_per_message_deflate=False,
        ws_ping_interval=20.0,
        ws_ping_timeout=20.0,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        # TLS is shared with gRPC (settings.tls_*): HTTPS and WSS on the same port.
        ssl_certfile=settings.tls_cert_file,
        ssl_keyfile=settings.tls_key_file,
    )


def serve(
    settings: Settings,
    runtime: Runtime | None = None,
    sockets: list[socket.socket] | None = None,
) -> None:
    """Serve until stopped; `sockets` may be bound beforehand (so a busy port is reported
    before anything loads, and port 0 works)."""
    uvicorn.Server(uvicorn_config(settings, runtime)).run(sockets=sockets)

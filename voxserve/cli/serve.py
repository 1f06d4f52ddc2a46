"""`voxserve serve`: bind the port first (a busy port is one line, not a uvicorn log), say
where to connect, run until SIGINT or SIGTERM, and exit 0 after a graceful shutdown."""

from __future__ import annotations

import argparse
import contextlib
import errno
import signal
import socket
from collections.abc import Iterator
from types import FrameType
from typing import Any

from voxserve.cli.errors import EXIT_OK, EXIT_USAGE, PROG, CliError
from voxserve.cli.settings import check_engines_import, load_cli_settings


def cmd_serve(args: argparse.Namespace) -> int:
    """Stopping the server is the normal way to end it: SIGINT or SIGTERM, at any point
    (starting, loading, serving), exits 0 after a graceful shutdown."""
    with _sigterm_interrupts():
        try:
            return _serve(args)
        except KeyboardInterrupt:  # uvicorn re-raises the signal after shutting down
            return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    from voxserve.observe.logs import configure_logging
    from voxserve.runtime import Runtime
    from voxserve.server.serve import serve

    settings = load_cli_settings(args, host=args.host, port=args.port, log_level=args.log_level)
    json_logs = args.log_format == "json"
    configure_logging(settings.log_level, json_format=json_logs)
    check_engines_import(settings)
    sockets = bind_sockets(settings.host, settings.port)
    try:
        port = sockets[0].getsockname()[1]
        print(connect_line(settings.host, port), flush=True)
        serve(settings, Runtime(settings), sockets)
    except SystemExit as exc:  # uvicorn exits with 1 when startup fails (logged above)
        if exc.code in (0, None):
            return EXIT_OK
        raise CliError("the server failed to start; see the log lines above") from exc
    finally:
        for sock in sockets:
            sock.close()
    return EXIT_OK


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """Bind (and listen on) every address `host` resolves to, as uvicorn would.

    Binding here, before uvicorn starts, turns a busy port into one clear line instead of
    uvicorn's log-and-exit, and handing the bound sockets to uvicorn leaves no race."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise CliError(f"cannot resolve host {host!r}: {exc.strerror}", EXIT_USAGE) from exc
    sockets: list[socket.socket] = []
    seen: set[tuple[int, Any]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:  # every address on the port the first got
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            try:
                sock.bind(address)
            except OSError as exc:
                where = f"{host}:{port}"
                if exc.errno == errno.EADDRINUSE:
                    raise CliError(
                        f"port {port} is already in use on {host}; stop the other server "
                        "or choose another port with --port"
                    ) from exc
                raise CliError(f"cannot listen on {where}: {exc.strerror}") from exc
            sock.listen(2048)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def connect_line(host: str, port: int) -> str:
    """Where a client connects: a wildcard host is shown as the loopback address."""
    shown = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in shown:
        shown = f"[{shown}]"
    base = f"http://{shown}:{port}"
    also = "" if shown == host else f" (all interfaces: {host or '*'})"
    return (
        f"{PROG} listening on {base}{also} (WebSocket ws://{shown}:{port}/v1/stream, "
        f"OpenAI base_url {base}/v1); models loading, /readyz turns 200 when ready"
    )


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C. While uvicorn runs it handles both signals (graceful
    shutdown), then re-raises the signal with the handler it found: this one, so SIGTERM
    ends as KeyboardInterrupt too, not as death by signal."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

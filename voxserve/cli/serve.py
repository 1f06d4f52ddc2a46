"""`voxserve serve`: bind the port first (a busy port is one line, not a uvicorn log), say
where to connect, run until SIGINT or SIGTERM, and exit 0 after a graceful shutdown."""

from __future__ import annotations

import argparse
import errno
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxserve.cli.admin_http import url_host
from voxserve.cli.cache import with_cache_dir
from voxserve.cli.errors import EXIT_OK, EXIT_USAGE, PROG, CliError
from voxserve.cli.settings import check_engines_import, load_cli_settings
from voxserve.cli.signals import sigterm_interrupts
from voxserve.cli.voices import checked_voice_table, close_built
from voxserve.cli.workers import run_workers, workers_transports

if TYPE_CHECKING:
    from voxserve.config import Settings


def cmd_serve(args: argparse.Namespace) -> int:
    """Stopping the server is the normal way to end it: SIGINT or SIGTERM, at any point
    (starting, loading, serving), exits 0 after a graceful shutdown."""
    with sigterm_interrupts():
        try:
            return _serve(args)
        except KeyboardInterrupt:  # uvicorn re-raises the signal after shutting down
            return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    from voxserve.engines.hub import set_offline
    from voxserve.observe.logs import configure_logging
    from voxserve.runtime import Runtime
    from voxserve.server.realtime_api.secrets import check_store
    from voxserve.server.serve import serve

    settings = load_cli_settings(
        args,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        grpc_port=getattr(args, "grpc_port", None),
        wyoming_port=getattr(args, "wyoming_port", None),
        tls_cert_file=_path(getattr(args, "tls_cert", None)),
        tls_key_file=_path(getattr(args, "tls_key", None)),
        otel_enabled=getattr(args, "otel", None),
        workers=getattr(args, "workers", None),
        tracemalloc_frames=getattr(args, "tracemalloc", None),
        offline=getattr(args, "offline", None),
    )
    settings = with_cache_dir(settings, getattr(args, "cache_dir", None))
    settings = with_auth_flags(settings, args)
    settings = with_zeroconf_flags(settings, args)
    if getattr(args, "max_sessions", None):
        limits = settings.limits.model_copy(update={"max_sessions": args.max_sessions})
        settings = settings.model_copy(update={"limits": limits})
    settings = with_cluster(settings, getattr(args, "cluster", None))
    modules = {**settings.log_modules, **parse_log_modules(getattr(args, "log_module", None))}
    settings = settings.model_copy(update={"log_modules": modules})
    json_logs = args.log_format == "json"
    configure_logging(settings.log_level, json_format=json_logs, module_levels=modules)
    if settings.otel_enabled:
        _configure_otel()
    set_offline(settings.offline)  # engines and forked workers read it (engines/hub.py)
    check_engines_import(settings)
    check_transports(settings)
    check_wake_settings(settings)
    check_store(settings)  # the client-secret store's directory: writable, or exit 2
    settings = workers_transports(settings)  # --workers N: HTTP/WebSocket only
    sockets = bind_sockets(settings.host, settings.port)
    try:
        check_transport_ports(settings)
        preloaded = checked_voice_table(settings)  # a bad table: one line, exit 2
        port = sockets[0].getsockname()[1]
        tls = settings.tls_cert_file is not None
        print(connect_line(settings.host, port, tls=tls), flush=True)
        for line in transport_lines(settings, tls=tls):
            print(line, flush=True)
        if settings.workers > 1:  # the parent supervises; each worker serves
            close_built(preloaded)
            return run_workers(settings, sockets)
        serve(settings, Runtime(settings, preloaded=preloaded), sockets)
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
                        "or choose another port with --port",
                        EXIT_USAGE,
                    ) from exc
                raise CliError(f"cannot listen on {where}: {exc.strerror}", EXIT_USAGE) from exc
            sock.listen(2048)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def connect_line(host: str, port: int, *, tls: bool = False) -> str:
    """Where a client connects."""
    shown = url_host(host)
    base = f"{'https' if tls else 'http'}://{shown}:{port}"
    ws = "wss" if tls else "ws"
    also = "" if shown.strip("[]") == host else f" (all interfaces: {host or '*'})"
    return (
        f"{PROG} listening on {base}{also} (WebSocket {ws}://{shown}:{port}/v1/stream, "
        f"OpenAI base_url {base}/v1); models loading, /readyz turns 200 when ready"
    )


def transport_lines(settings: Settings, *, tls: bool = False) -> list[str]:
    """One line per extra transport that is on."""
    shown = url_host(settings.host)
    lines = []
    if settings.grpc_port:
        security = "TLS" if tls else "plaintext"
        lines.append(
            f"{PROG} gRPC voxserve.v1 on {shown}:{settings.grpc_port} ({security}; "
            "health and reflection included)"
        )
    if settings.wyoming_port:
        lines.append(f"{PROG} Wyoming on tcp://{shown}:{settings.wyoming_port} (plain TCP)")
    return lines


def check_transports(settings: Settings) -> None:
    """Before anything binds or loads: TLS files, and the gRPC/Wyoming packages when their
    port is on (one clear line each, not a failed start-up)."""
    from voxserve.server.transports import check_tls, check_transport_packages

    check_tls(settings)
    check_transport_packages(settings)
    check_auth(settings)


def check_wake_settings(settings: Settings) -> None:
    """Wake model names, checked before listening (engines/micro_wakeword.py)."""
    from voxserve.engines.micro_wakeword import check_wake

    check_wake(settings.wake)


def check_auth(settings: Settings) -> None:
    """Keys readable and valid; no unauthenticated non-loopback server unless asked."""
    from voxserve.server.session.auth import check_auth_settings

    check_auth_settings(settings)


def with_cluster(settings: Settings, flag: str | None) -> Settings:
    """`--cluster [ADDRESS]` or `cluster.enabled`: ASR and TTS go to the Ray Serve core
    tier (voxserve/cluster/gateway.py rewrites the engines; the pipeline is unchanged)."""
    if flag is None and not settings.cluster.enabled:
        return settings
    from voxserve.cli.cluster import check_ray
    from voxserve.cluster.gateway import cluster_settings

    settings = cluster_settings(settings, flag or None)
    check_ray(settings.cluster.address)
    return settings


def with_auth_flags(settings: Settings, args: argparse.Namespace) -> Settings:
    """--api-key (added to the configured keys), --api-keys-file, --admin-key,
    --insecure-no-auth, --cors-origin and --allowed-host over the settings."""
    from pydantic import SecretStr, ValidationError

    from voxserve.config import with_updates

    update: dict[str, Any] = {}
    keys = getattr(args, "api_key", None)
    if keys:
        update["api_keys"] = [*settings.api_keys, *(SecretStr(k) for k in keys)]
    if getattr(args, "api_keys_file", None):
        update["api_keys_file"] = Path(args.api_keys_file)
    if getattr(args, "admin_key", None):
        update["admin_key"] = SecretStr(args.admin_key)
    if getattr(args, "insecure_no_auth", None):
        update["insecure_no_auth"] = True
    origins = getattr(args, "cors_origin", None)
    if origins:
        update["cors_allowed_origins"] = [*settings.cors_allowed_origins, *origins]
    hosts = getattr(args, "allowed_host", None)
    if hosts:
        named = [name.strip() for value in hosts for name in value.split(",") if name.strip()]
        update["allowed_hosts"] = [*settings.allowed_hosts, *named]
    try:
        return with_updates(settings, **update)
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = _AUTH_FLAGS.get(str(first["loc"][0]), str(first["loc"][0]))
        raise CliError(f"{flag}: {first['msg'].removeprefix('Value error, ')}", EXIT_USAGE) from exc


_AUTH_FLAGS = {
    "api_keys": "--api-key",
    "api_keys_file": "--api-keys-file",
    "admin_key": "--admin-key",
    "cors_allowed_origins": "--cors-origin",
    "allowed_hosts": "--allowed-host",
}


def with_zeroconf_flags(settings: Settings, args: argparse.Namespace) -> Settings:
    """--no-zeroconf and --zeroconf-name over `wyoming` (the name checked like the
    config's: a bad one is one line, exit 2)."""
    from pydantic import ValidationError

    from voxserve.config import ConfigError, WyomingConfig

    update: dict[str, Any] = {}
    if getattr(args, "no_zeroconf", None):
        update["zeroconf"] = False
    if getattr(args, "zeroconf_name", None) is not None:
        update["zeroconf_name"] = args.zeroconf_name
    if not update:
        return settings
    try:
        wyoming = WyomingConfig.model_validate({**settings.wyoming.model_dump(), **update})
    except ValidationError as exc:
        raise ConfigError(f"--zeroconf-name: {exc.errors()[0]['msg']}") from None
    return settings.model_copy(update={"wyoming": wyoming})


def check_transport_ports(settings: Settings) -> None:
    """The gRPC and Wyoming ports are free now (the servers bind them at start-up, in the
    lifespan, where a busy port would only be a log line and exit code 1)."""
    for name, flag, port in (
        ("gRPC", "--grpc-port", settings.grpc_port),
        ("Wyoming", "--wyoming-port", settings.wyoming_port),
    ):
        if not port:
            continue
        if port == settings.port:
            raise CliError(
                f"the {name} port {port} is the HTTP port too; choose another with {flag}",
                EXIT_USAGE,
            )
        try:
            probes = bind_sockets(settings.host, port)
        except CliError as exc:
            cause = exc.__cause__
            reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else exc
            raise CliError(
                f"the {name} port {port} cannot be used on {settings.host} ({reason}); "
                f"choose another with {flag}, or {flag} 0 to disable {name}",
                EXIT_USAGE,
            ) from exc
        for sock in probes:
            sock.close()


def parse_log_modules(items: list[str] | None) -> dict[str, str]:
    """`--log-module voxserve.pipeline=debug` (repeatable) as {logger: level}."""
    from voxserve.observe.logs import parse_level

    found: dict[str, str] = {}
    for item in items or []:
        name, sep, level = item.partition("=")
        if not sep or not name.strip():
            raise CliError(f"--log-module {item!r}: use LOGGER=LEVEL", EXIT_USAGE)
        try:
            parse_level(level)
        except ValueError as exc:
            raise CliError(f"--log-module {item!r}: {exc}", EXIT_USAGE) from None
        found[name.strip()] = level.strip().lower()
    return found


def _configure_otel() -> None:
    try:
        from voxserve.observe.tracing import configure_sdk

        configure_sdk()
    except ImportError as exc:
        raise CliError(
            f"--otel needs OpenTelemetry: pip install 'voxserve[otel]' ({exc})", EXIT_USAGE
        ) from exc


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None

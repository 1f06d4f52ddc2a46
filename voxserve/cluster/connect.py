"""One Ray connection per process, and the handles of the core deployments.

The gateway connects as a Ray driver when its remote engines load (in the runtime's load
thread); `voxserve cluster` commands connect the same way. A process that is already
connected (a test, `cluster up`'s own head) is reused, never re-initialised.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from pathlib import Path
from typing import Any

from voxserve.config import ClusterConfig, ConfigError

ASR_DEPLOYMENT = "AsrCore"
TTS_DEPLOYMENT = "TtsCore"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
PROBE_TIMEOUT_S = 5.0  # a cluster address that takes longer to accept a connection is down

_lock = threading.Lock()


def asr_app(config: ClusterConfig) -> str:
    return f"{config.app_name}-asr"


def tts_app(config: ClusterConfig) -> str:
    return f"{config.app_name}-tts"


def is_local(address: str | None) -> bool:
    """A cluster on this host: started here (None) or addressed by loopback."""
    return address is None or address.rsplit(":", 1)[0] in LOOPBACK_HOSTS


def sandbox_env() -> None:
    """For a cluster on loopback: without this Ray turns 127.0.0.1 into the host's first
    interface address, which may be unreachable (seen in containers). Ray reads it once,
    at import, so this runs before the first `import ray`; a value already set is kept."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    local_token_auth()


def local_token_auth() -> None:
    """Token auth for a cluster on this host, said explicitly and with the token in place
    before the first import of Ray (a value already set is kept).

    Ray (2.5x+) turns token auth on for a local head it starts and writes ~/.ray/auth_token
    if it is missing, but a process decides its own mode once, when it imports Ray, from
    RAY_AUTH_MODE or (left unset) from whether the file exists then. On a fresh machine the
    first local head writes the file while other processes have already decided: their
    clients send no token to a head that wants one (CI: "InvalidAuthToken ... RAY_AUTH_MODE
    is currently 'disabled'"). So the file is made here as Ray would (256 random bits, hex),
    atomically, so that a concurrent process never reads it half written, and the mode is
    set, so every process and the nodes it starts agree."""
    if "RAY_AUTH_MODE" in os.environ or "RAY_AUTH_TOKEN" in os.environ:
        return
    path = Path.home() / ".ray" / "auth_token"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".auth_token.{os.getpid()}")
        draft.write_text(secrets.token_hex(32))
        draft.chmod(0o600)
        try:
            os.link(draft, path)  # fails if another process got there first: its token stays
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    os.environ["RAY_AUTH_MODE"] = "token"


def init_kwargs(address: str | None, node_ip_address: str | None = None) -> dict[str, Any]:
    """ray.init options: quiet, loopback node address for a local cluster, or the node this
    process joins where one host runs several (`cluster.node_ip_address`). `None` starts a
    new local instance (Ray's "local"; never one that RAY_ADDRESS points to), without the
    dashboard."""
    kwargs: dict[str, Any] = {"log_to_driver": False}
    if node_ip_address:
        kwargs["_node_ip_address"] = node_ip_address
    elif is_local(address):
        kwargs["_node_ip_address"] = "127.0.0.1"
    if address is None:
        kwargs["address"] = "local"
        kwargs["include_dashboard"] = False  # only valid when starting a new cluster
    else:
        kwargs["address"] = address
    return kwargs


def connect(config: ClusterConfig) -> None:
    """Connect this process to the cluster at `config.address` (once)."""
    if is_local(config.address):
        sandbox_env()
    import ray

    with _lock:
        if ray.is_initialized():
            return
        check_reachable(config.address)
        ray.init(namespace=config.namespace, **init_kwargs(config.address, config.node_ip_address))


def check_reachable(address: str | None, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """A `host:port` (or `ray://host:port`) nobody listens on is a ConfigError now: Ray
    itself retries its GCS for minutes, printing only warnings."""
    if address is None or address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or (":" in host and not host.startswith("[")):
        return  # Ray's to judge (a bare IPv6 address has no port to split off)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"no Ray cluster answers at {address} ({reason}); start one with "
            "`voxserve cluster up` or set cluster.address (--address, --cluster)"
        ) from None


def deployment_handle(config: ClusterConfig, deployment: str, app: str) -> Any:
    """A DeploymentHandle (typed Any: Ray ships no stubs)."""
    connect(config)
    from ray import serve

    return serve.get_deployment_handle(deployment, app_name=app)

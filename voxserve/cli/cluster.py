"""`voxserve cluster up / status / down`: the core tier on Ray Serve (docs/cluster.md).

`up` without --address starts a local Ray head in this process, deploys the tiers, prints
the address gateways connect to (`voxserve serve --cluster ADDRESS`), and runs until SIGINT
or SIGTERM, then shuts Serve and Ray down (nothing is left running). With --address it
deploys onto an existing cluster and returns; the deployments stay until `down`.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeAlias

from voxserve.cli.errors import EXIT_OK, EXIT_USAGE, PROG, CliError
from voxserve.cli.settings import configure_cli_logging, load_cli_settings

if TYPE_CHECKING:
    from voxserve.config import Settings

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
CLUSTER_HINT = "pip install 'voxserve[cluster]'"


def add_cluster_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    cluster = commands.add_parser(
        "cluster",
        parents=[common],
        help="run the ASR and TTS core tier on Ray Serve (up, status, down)",
        description="The core tier of a scaled-out voxserve: ASR and TTS as Ray Serve "
        "deployments that gateways (`voxserve serve --cluster ADDRESS`) call. Needs the "
        f"cluster extra ({CLUSTER_HINT}).",
    )
    actions = cluster.add_subparsers(title="actions", dest="action", required=True)

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(handler=cmd_cluster)
        sub.add_argument(
            "--address",
            help="Ray cluster address (host:port of its GCS, or 'auto'); "
            + ("default: start a local head here" if name == "up" else "default: cluster.address"),
        )
        return sub

    up = action("up", "deploy the ASR and TTS tiers (on a local Ray head unless --address)")
    up.add_argument(
        "--num-cpus",
        type=float,
        metavar="N",
        help="CPUs each local node offers to replicas (default: all of this host's; "
        "1 with --nodes)",
    )
    up.add_argument(
        "--nodes",
        type=int,
        default=1,
        metavar="N",
        help="simulate N Ray nodes on this host (a head and N-1 workers, each its own "
        "raylet), to try placement and failover; local only",
    )
    action("status", "show each tier's application status and replica states").add_argument(
        "--json", action="store_true", help="print JSON"
    )
    action("down", "delete the ASR and TTS tiers").add_argument(
        "--stop-serve", action="store_true", help="also stop Ray Serve's controller"
    )


def cmd_cluster(args: argparse.Namespace) -> int:
    configure_cli_logging(args)
    settings = load_cli_settings(args)
    if args.address:
        settings = settings.model_copy(
            update={"cluster": settings.cluster.model_copy(update={"address": args.address})}
        )
    check_ray(settings.cluster.address if args.address else None)
    if args.action == "up":
        if args.nodes < 1 or (args.nodes > 1 and args.address):
            raise CliError("--nodes takes N >= 1, and only for a local cluster", EXIT_USAGE)
        return _up(settings, local=not args.address, num_cpus=args.num_cpus, nodes=args.nodes)
    if args.action == "status":
        return _status(settings, as_json=args.json)
    if args.action == "down":
        from voxserve.cluster.control import delete

        deleted = delete(settings.cluster, stop_serve=args.stop_serve)
        print(f"deleted: {', '.join(deleted) or 'nothing (no voxserve tier deployed)'}")
        return EXIT_OK
    raise CliError(f"unknown cluster action {args.action!r}", EXIT_USAGE)


def check_ray(address: str | None) -> None:
    """Ray Serve is installed (one clear line if not); for a cluster on this host, Ray's
    environment is set before its first import (voxserve/cluster/connect.py)."""
    from voxserve.cluster.connect import is_local, sandbox_env

    if is_local(address):
        sandbox_env()
    try:
        import ray.serve  # noqa: F401
    except ImportError as exc:
        raise CliError(f"the cluster commands need Ray Serve ({exc}); {CLUSTER_HINT}") from exc


def _up(settings: Settings, *, local: bool, num_cpus: float | None, nodes: int = 1) -> int:
    import ray

    from voxserve.cluster.connect import init_kwargs
    from voxserve.cluster.control import deploy, describe_tiers

    cluster = settings.cluster
    simulated: Any = None  # ray.cluster_utils.Cluster when --nodes > 1
    if local and nodes > 1:
        simulated = _simulated_cluster(nodes, num_cpus or 1.0)
        ray.init(
            address=simulated.address,
            namespace=cluster.namespace,
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
        )
    elif local:
        kwargs: dict[str, Any] = init_kwargs(None)
        if num_cpus is not None:
            kwargs["num_cpus"] = num_cpus
        ray.init(namespace=cluster.namespace, **kwargs)
    if local:
        address = ray.get_runtime_context().gcs_address
        cluster = cluster.model_copy(update={"address": address})
        settings = settings.model_copy(update={"cluster": cluster})
    try:
        deploy(settings)
        served = describe_tiers(cluster)
        print(
            f"{PROG} cluster up at {cluster.address}: asr languages "
            f"{', '.join(served['languages'])}; tts voices {', '.join(served['voices'])}",
            flush=True,
        )
        print(f"gateways: {PROG} serve --cluster {cluster.address}", flush=True)
        if local:
            print("serving until Ctrl-C or SIGTERM (then Serve and Ray stop)", flush=True)
            _wait_for_signal()
    finally:
        if local:
            from ray import serve

            serve.shutdown()  # type: ignore[no-untyped-call]
            ray.shutdown()
            if simulated is not None:
                simulated.shutdown()
    return EXIT_OK


def _simulated_cluster(nodes: int, num_cpus: float) -> Any:
    """A head and nodes-1 worker nodes on this host (Ray's own test utility)."""
    from ray.cluster_utils import Cluster

    node: dict[str, Any] = {"node_ip_address": "127.0.0.1", "num_cpus": num_cpus}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    for _ in range(nodes - 1):
        cluster.add_node(**node)
    cluster.wait_for_nodes()
    return cluster


def _wait_for_signal() -> None:
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _status(settings: Settings, *, as_json: bool) -> int:
    from voxserve.cluster.control import status

    found = status(settings.cluster)
    if as_json:
        print(json.dumps(found, indent=2, sort_keys=True))
        return EXIT_OK
    for tier, state in found.items():
        replicas = ", ".join(f"{k.lower()} {v}" for k, v in state.get("replicas", {}).items())
        line = f"{tier}: {state['app']} {state['status']}"
        print(line + (f" (replicas: {replicas})" if replicas else ""))
        if state.get("message"):
            print(f"  {state['message']}")
    return EXIT_OK

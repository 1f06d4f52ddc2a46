"""`voxserve cluster up / status / down`: the core tier on Ray Serve (docs/cluster.md).

`up` without --address starts a local Ray head in this process, deploys the tiers, prints
the address gateways connect to (`voxserve serve --cluster ADDRESS`), and runs until SIGINT
or SIGTERM, then shuts Serve and Ray down (nothing is left running). With --address it
deploys onto an existing cluster and returns; the deployments stay until `down`.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import time
from typing import TYPE_CHECKING, Any

from voxserve.cli.argtypes import Subparsers, action_command
from voxserve.cli.errors import EXIT_OK, EXIT_USAGE, PROG, CliError
from voxserve.cli.settings import (
    check_engines_import,
    configure_cli_logging,
    load_cli_settings,
)
from voxserve.cli.signals import interrupt, sigterm_interrupts

if TYPE_CHECKING:
    from voxserve.config import ClusterConfig, Settings

CLUSTER_HINT = "pip install 'voxserve[cluster]'"


def add_cluster_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    cluster_action = action_command(
        commands,
        common,
        "cluster",
        cmd_cluster,
        help_text="run the ASR and TTS core tier on Ray Serve (up, status, down)",
        description="The core tier of a scaled-out voxserve: ASR and TTS as Ray Serve "
        "deployments that gateways (`voxserve serve --cluster ADDRESS`) call. Needs the "
        f"cluster extra ({CLUSTER_HINT}).",
    )

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = cluster_action(name, help_text)
        sub.add_argument(
            "--address",
            help="Ray cluster address (host:port of its GCS, or 'auto'); "
            + ("default: start a local head here" if name == "up" else "default: cluster.address"),
        )
        return sub

    up = action("up", "deploy the ASR and TTS tiers (on a local Ray head unless --address)")
    up.add_argument(
        "--num-cpus",
        type=int,
        metavar="N",
        help="whole CPUs each local node offers to replicas (default: all of this host's; "
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
    local_up = args.action == "up" and not args.address
    check_ray(None if local_up else settings.cluster.address)
    if args.action == "up":
        if args.nodes < 1 or (args.nodes > 1 and args.address):
            raise CliError("--nodes takes N >= 1, and only for a local cluster", EXIT_USAGE)
        # The core's engines, checked here as `serve` checks its own: a bad name or option
        # is one line and exit 2, not a replica that fails inside Ray.
        by_language = settings.cluster.asr_languages.values()
        check_engines_import(settings, [("asr", spec) for spec in by_language])
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


def _up(settings: Settings, *, local: bool, num_cpus: int | None, nodes: int = 1) -> int:
    """Stopping is the normal way to end a local `up`: SIGINT or SIGTERM at any point
    (starting Ray, deploying, serving) shuts Serve and Ray down and exits 0."""
    started: list[Any] = []  # what to stop: the simulated cluster, if any
    with sigterm_interrupts():
        try:
            _deploy(settings, local=local, num_cpus=num_cpus, nodes=nodes, started=started)
        except KeyboardInterrupt:
            pass
        finally:
            if local:
                _stop_local(started)
    return EXIT_OK


def _deploy(
    settings: Settings, *, local: bool, num_cpus: int | None, nodes: int, started: list[Any]
) -> None:
    import ray

    from voxserve.cluster.connect import init_kwargs
    from voxserve.cluster.control import deploy, describe_tiers

    cluster = settings.cluster
    if local and (nodes > 1 or num_cpus is not None):
        # The CPUs offered are known before Ray starts (~10 s of two cores): refuse now.
        _check_cpus(cluster, float(nodes * (num_cpus or 1)), math.inf)
    if local and nodes > 1:
        started.append(_simulated_cluster(nodes, num_cpus or 1))
        ray.init(
            address=started[0].address,
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
        signal.signal(signal.SIGTERM, interrupt)  # ray.init installs its own (exit 15)
        cluster = cluster.model_copy(update={"address": ray.get_runtime_context().gcs_address})
        settings = settings.model_copy(update={"cluster": cluster})
        resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
        _check_cpus(cluster, float(resources.get("CPU", 0.0)), float(resources.get("GPU", 0.0)))
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
        while True:
            time.sleep(3600)


def _check_cpus(cluster: ClusterConfig, offered: float, offered_gpus: float = 0.0) -> None:
    """A local cluster that cannot place every replica (CPUs, GPUs) would make Serve wait
    forever: say so instead (a remote cluster may add nodes on demand: not checked)."""
    needed = gpus_needed = 0.0
    for tier in (cluster.asr, cluster.tts):
        replicas = tier.num_replicas
        if tier.autoscaling is not None:
            replicas = int(tier.autoscaling.get("min_replicas", 1))
        needed += replicas * tier.num_cpus
        gpus_needed += replicas * tier.num_gpus
    if gpus_needed > offered_gpus + 1e-9:
        raise CliError(
            f"the ASR and TTS replicas need {gpus_needed:g} GPUs and this cluster offers "
            f"{offered_gpus:g}: lower cluster.asr/tts num_gpus or run on a node with GPUs",
            EXIT_USAGE,
        )
    if needed > offered + 1e-9:
        raise CliError(
            f"the ASR and TTS replicas need {needed:g} CPUs and this cluster offers "
            f"{offered:g}: raise --num-cpus or --nodes, or lower cluster.asr/tts num_cpus "
            "or num_replicas",
            EXIT_USAGE,
        )


def _stop_local(started: list[Any]) -> None:
    import ray
    from ray import serve

    if ray.is_initialized():
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
    for simulated in started:
        simulated.shutdown()


def _simulated_cluster(nodes: int, num_cpus: int) -> Any:
    """A head and nodes-1 worker nodes on this host (Ray's own test utility)."""
    from ray.cluster_utils import Cluster

    node: dict[str, Any] = {"node_ip_address": "127.0.0.1", "num_cpus": num_cpus}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    for _ in range(nodes - 1):
        cluster.add_node(**node)
    cluster.wait_for_nodes()
    return cluster


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

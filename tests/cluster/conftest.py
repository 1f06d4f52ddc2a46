"""One simulated two-node Ray cluster for the tests of this package
(ray.cluster_utils.Cluster: a head and a worker node, each its own raylet, on this machine),
with the core tier deployed once: ASR (whisper) and TTS (espeak + the `load` tone), a
replica of each on each node.

Started by the first test that needs it and shut down when the package's tests are done,
so the rest of a full run pays nothing for it, and tests without Ray (test_credits.py) never
start it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from voxserve.cluster.connect import sandbox_env
from voxserve.config import (
    ClusterConfig,
    ClusterDeployment,
    EnginesConfig,
    EngineSpec,
    Settings,
    load_settings,
)

sandbox_env()  # before Ray is imported: every node here is on loopback


def need_ray() -> None:
    pytest.importorskip("ray.serve", reason="the cluster extra (ray[serve]) is not installed")


# A stream of the load engine: 60 ms of tone per character in 200 ms chunks, 50 ms of CPU
# per chunk: a stream lasts long enough to kill its replica in the middle.
LOAD_TTS = EngineSpec(name="load", options={"cpu_ms_per_second_of_audio": 250.0})


def core_settings(app_name: str = "vxtest", **cluster: Any) -> Settings:
    """Settings of a small core: a replica per node and tier, a quarter CPU each."""
    tier = ClusterDeployment(num_replicas=2, num_cpus=0.25, max_replicas_per_node=1)
    config = ClusterConfig(app_name=app_name, asr=tier, tts=tier, **cluster)
    engines = EnginesConfig(
        asr=EngineSpec(name="whisper"), tts=[EngineSpec(name="espeak"), LOAD_TTS]
    )
    return load_settings(log_level="warning").model_copy(
        update={"engines": engines, "cluster": config}
    )


@dataclass
class TwoNodes:
    cluster: Any  # ray.cluster_utils.Cluster
    address: str
    settings: Settings  # the deployed core's settings (app "vxtest")

    def config(self, **update: Any) -> ClusterConfig:
        """The core's cluster settings as a gateway uses them (enabled, this address)."""
        fields = {"address": self.address, "enabled": True, **update}
        return self.settings.cluster.model_copy(update=fields)


@pytest.fixture(scope="package")
def two_nodes() -> Iterator[TwoNodes]:
    need_ray()
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from voxserve.cluster.control import deploy

    node = {"node_ip_address": "127.0.0.1", "num_cpus": 1, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=dict(node))
    cluster.add_node(**{k: v for k, v in node.items() if k != "include_dashboard"})
    cluster.wait_for_nodes()
    ray.init(
        address=cluster.address,
        namespace="voxserve",
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    settings = core_settings()
    started = time.monotonic()
    deploy(
        settings.model_copy(
            update={"cluster": settings.cluster.model_copy(update={"address": cluster.address})}
        )
    )
    print(f"cluster up in {time.monotonic() - started:.1f} s")
    try:
        yield TwoNodes(cluster, cluster.address, settings)
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


def replica_pids(where: list[dict[str, Any]]) -> set[int]:
    return {int(w["pid"]) for w in where}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# The tight core: one TTS replica that runs one call at a time and queues one more per
# gateway, with a 400 ms wait before each first chunk, so refusals and deadlines are easy.
SLOW_TTS = EngineSpec(name="load", options={"sleep_ms": 400.0, "cpu_ms_per_second_of_audio": 50.0})


@pytest.fixture(scope="package")
def tight(two_nodes: TwoNodes) -> ClusterConfig:
    from ray import serve

    from voxserve.cluster.connect import tts_app
    from voxserve.cluster.deployments import tts_application

    one = ClusterDeployment(
        num_replicas=1, num_cpus=0.25, max_ongoing_requests=1, max_queued_requests=1
    )
    config = two_nodes.config(app_name="vxtight", tts=one)
    engines = EnginesConfig(tts=[SLOW_TTS])
    serve.run(tts_application(engines, config), name=tts_app(config), route_prefix=None)
    return config


def where(handle: Any, model_id: str | None = None) -> dict[str, Any]:
    """Which replica a request for `model_id` is routed to (None: any), what it holds."""
    routed = handle.options(method_name="where")
    if model_id is not None:
        routed = routed.options(multiplexed_model_id=model_id)
    found: dict[str, Any] = routed.remote().result(timeout_s=30)
    return found


def wait_until(check: Any, timeout_s: float = 20.0, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s")
        time.sleep(every_s)

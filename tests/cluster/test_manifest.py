"""deploy/rayservice.yaml: its voxserve config is valid, and its Serve config is one Ray
Serve accepts, with import paths that build the core's applications."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import need_ray
from voxserve.config import load_settings

MANIFEST = Path(__file__).parents[2] / "deploy" / "rayservice.yaml"


def documents() -> dict[str, Any]:
    import yaml

    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text())}


def test_the_rayservice_config_deploys_both_tiers_from_the_configmap(tmp_path: Path) -> None:
    need_ray()
    import yaml
    from ray.serve.deployment import Application
    from ray.serve.schema import ServeDeploySchema

    docs = documents()
    config = tmp_path / "voxserve.toml"
    config.write_text(docs["ConfigMap"]["data"]["voxserve.toml"])
    settings = load_settings(config)
    assert settings.cluster.asr.autoscaling is not None
    assert settings.cluster.asr.autoscaling["max_replicas"] == 8

    serve_config = ServeDeploySchema.model_validate(
        yaml.safe_load(docs["RayService"]["spec"]["serveConfigV2"])
    )
    apps = {app.name: app for app in serve_config.applications}
    assert set(apps) == {"voxserve-asr", "voxserve-tts"}  # what the gateways look up
    for app in apps.values():
        module, _, name = app.import_path.partition(":")
        builder = getattr(importlib.import_module(module), name)
        built = builder({"config": str(config)})
        assert isinstance(built, Application)


def test_gateways_join_the_cluster_without_cpus_and_serve_with_cluster() -> None:
    docs = documents()
    gateway = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    command = " ".join(gateway["args"])
    assert "ray start" in command and "--num-cpus=0" in command
    assert "voxserve serve" in command and "--cluster auto" in command
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_tier_settings_become_serve_deployment_options() -> None:
    need_ray()
    from voxserve.cluster.deployments import deployment_options
    from voxserve.config import ClusterDeployment

    fixed = deployment_options(
        ClusterDeployment(
            num_replicas=3, num_cpus=0.5, max_ongoing_requests=2, max_queued_requests=8
        )
    )
    assert fixed == {
        "ray_actor_options": {"num_cpus": 0.5},
        "max_ongoing_requests": 2,
        "max_queued_requests": 8,
        "num_replicas": 3,
    }
    scaled = deployment_options(
        ClusterDeployment(
            max_replicas_per_node=1, autoscaling={"min_replicas": 1, "max_replicas": 4}
        )
    )
    assert "num_replicas" not in scaled  # Serve refuses both
    assert scaled["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4}
    assert scaled["max_replicas_per_node"] == 1


def test_num_gpus_reaches_the_replicas_and_is_checked_locally() -> None:
    need_ray()
    from voxserve.cli.cluster import _check_cpus
    from voxserve.cli.errors import CliError
    from voxserve.cluster.deployments import deployment_options
    from voxserve.config import ClusterConfig, ClusterDeployment

    gpu = ClusterDeployment(num_replicas=2, num_cpus=1, num_gpus=0.5)
    assert deployment_options(gpu)["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0.5}
    cluster = ClusterConfig(asr=gpu)
    _check_cpus(cluster, offered=4, offered_gpus=1)  # two half-GPU replicas fit one GPU
    with pytest.raises(CliError, match="need 1 GPUs and this cluster offers 0"):
        _check_cpus(cluster, offered=4, offered_gpus=0)

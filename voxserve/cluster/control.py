"""Deploy, inspect and delete the core tier: what `voxserve cluster up/status/down` do.

The deployments run without Serve's HTTP proxy: gateways call them through handles.
"""

from __future__ import annotations

from typing import Any

from voxserve.cluster.connect import (
    ASR_DEPLOYMENT,
    TTS_DEPLOYMENT,
    asr_app,
    connect,
    deployment_handle,
    tts_app,
)
from voxserve.config import ClusterConfig, Settings


def deploy(settings: Settings) -> None:
    """Deploy (or update in place) both tiers and wait until they are running."""
    from ray import serve

    from voxserve.cluster.deployments import asr_application, tts_application

    cluster = settings.cluster
    connect(cluster)
    serve.start(proxy_location="Disabled")
    serve.run(asr_application(settings.engines, cluster), name=asr_app(cluster), route_prefix=None)
    serve.run(tts_application(settings.engines, cluster), name=tts_app(cluster), route_prefix=None)


def status(cluster: ClusterConfig) -> dict[str, Any]:
    """Per tier: the application's status and its deployment's replica states."""
    from ray import serve

    connect(cluster)
    apps = serve.status().applications
    found: dict[str, Any] = {}
    for tier, app, deployment in (
        ("asr", asr_app(cluster), ASR_DEPLOYMENT),
        ("tts", tts_app(cluster), TTS_DEPLOYMENT),
    ):
        state = apps.get(app)
        if state is None:
            found[tier] = {"app": app, "status": "NOT_DEPLOYED"}
            continue
        dep = state.deployments.get(deployment)
        found[tier] = {
            "app": app,
            "status": str(getattr(state.status, "value", state.status)),
            "replicas": {
                str(getattr(k, "value", k)): v
                for k, v in (dep.replica_states if dep else {}).items()
            },
            "message": state.message or (dep.message if dep else ""),
        }
    return found


def describe_tiers(cluster: ClusterConfig, timeout_s: float = 60.0) -> dict[str, Any]:
    """What the tiers serve (languages, voices), asked of one replica each."""
    asr = deployment_handle(cluster, ASR_DEPLOYMENT, asr_app(cluster))
    tts = deployment_handle(cluster, TTS_DEPLOYMENT, tts_app(cluster))
    asr_desc = asr.options(method_name="describe").remote().result(timeout_s=timeout_s)
    tts_desc = tts.options(method_name="describe").remote().result(timeout_s=timeout_s)
    return {
        "languages": list(asr_desc["languages"]),
        "voices": [voice.id for entry in tts_desc for voice in entry.voices],
    }


def delete(cluster: ClusterConfig, *, stop_serve: bool = False) -> list[str]:
    """Delete both tiers' applications; `stop_serve` also stops Serve's controller."""
    from ray import serve

    connect(cluster)
    apps = serve.status().applications
    deleted = [app for app in (asr_app(cluster), tts_app(cluster)) if app in apps]
    for app in deleted:
        serve.delete(app)
    if stop_serve:
        serve.shutdown()  # type: ignore[no-untyped-call]
    return deleted

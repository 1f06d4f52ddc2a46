"""The gateway's side of `voxserve serve --cluster`: the same server, with the engines
config rewritten so ASR and TTS are the remote engines (`ray`). runtime.py and the pipeline
do not change; VAD and the responder stay in-process (VAD is per-frame work that a network
hop would cost more than it saves; the responder is I/O bound).
"""

from __future__ import annotations

from typing import Any

from voxserve.config import ClusterConfig, EngineSpec, Settings

REMOTE_ENGINE = "ray"


def cluster_settings(settings: Settings, address: str | None = None) -> Settings:
    """`settings` for a gateway of the cluster at `address` (None: `cluster.address`).

    The ASR and TTS stage limits become the credit window's maximum, so the window, not the
    stage, is what limits calls to the core; the executor gets a thread per such call
    (remote calls block a thread while they wait, using no CPU)."""
    cluster = settings.cluster.model_copy(
        update={"enabled": True, "address": address or settings.cluster.address}
    )
    options = {"cluster": cluster.model_dump(mode="json")}
    core_tts = [spec.name for spec in settings.engines.tts if spec.name != REMOTE_ENGINE]
    engines = settings.engines.model_copy(
        update={
            "asr": EngineSpec(name=REMOTE_ENGINE, options=options),
            "tts": [
                EngineSpec(name=REMOTE_ENGINE, options={**options, "engine": name})
                for name in core_tts
            ]
            or [EngineSpec(name=REMOTE_ENGINE, options=options)],
        }
    )
    pipeline = settings.pipeline
    width = cluster.credits.max
    executor = pipeline.executor.model_copy(
        update={
            "max_workers": max(
                pipeline.executor.max_workers, 2 * width + pipeline.vad.concurrency + 2
            )
        }
    )
    pipeline = pipeline.model_copy(
        update={
            "asr": pipeline.asr.model_copy(update={"concurrency": width}),
            "tts": pipeline.tts.model_copy(update={"concurrency": width}),
            "executor": executor,
        }
    )
    return settings.model_copy(
        update={"cluster": cluster, "engines": engines, "pipeline": pipeline}
    )


def gateway_config(options: dict[str, Any] | None) -> ClusterConfig:
    """The `cluster` option of a `ray` engine, which cluster_settings() writes. Without it
    (e.g. `voxserve engines --load` trying every registered engine) the engine refuses at
    once instead of connecting to whatever Ray cluster `auto` finds."""
    config = ClusterConfig.model_validate(options or {})
    if not config.enabled:
        raise ValueError(
            "the ray engines are the gateway's side of a cluster: use `voxserve serve "
            "--cluster [ADDRESS]` or cluster.enabled = true (docs/cluster.md)"
        )
    return config

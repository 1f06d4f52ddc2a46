"""`RemoteAsr`: the AsrEngine protocol over the core tier's ASR deployment (engine `ray`).

Registered in the `voxserve.asr` entry-point group, so engines/loaded.py builds it like any engine;
`voxserve serve --cluster` selects it (gateway.py). Languages and info come from the core.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from voxserve.cluster.calls import TierClient
from voxserve.cluster.connect import ASR_DEPLOYMENT, asr_app, deployment_handle
from voxserve.cluster.credits import tier_credits
from voxserve.cluster.gateway import gateway_config
from voxserve.engines.base import Float32Array
from voxserve.types import AsrOptions, AsrResult, AsrTask, EngineInfo

DESCRIBE_TIMEOUT_S = 120.0  # the first call may wait for a replica to load its model


class RemoteAsr:
    def __init__(self, *, cluster: dict[str, Any] | None = None, threads: int = 1) -> None:
        """`cluster`: the `cluster` settings section; `threads` is the runtime's default
        for every engine and means nothing here (the core sizes its own)."""
        self.config = gateway_config(cluster)
        handle = deployment_handle(self.config, ASR_DEPLOYMENT, asr_app(self.config))
        self.client = TierClient(
            "asr", handle, tier_credits("asr", self.config.credits), retries=self.config.retries
        )
        described = (
            handle.options(method_name="describe").remote().result(timeout_s=DESCRIBE_TIMEOUT_S)
        )
        core: EngineInfo = described["info"]
        self.languages: tuple[str, ...] = tuple(described["languages"])
        self.tasks: tuple[AsrTask, ...] = tuple(described.get("tasks", ("transcribe",)))
        self.info = EngineInfo(
            "asr", "ray", core.package, core.version, core.license, f"{core.name}/{core.model}"
        )

    def _language(self, language: str | None) -> str:
        if language is None:
            return self.languages[0]
        if language not in self.languages:
            raise ValueError(f"language {language!r} is not served; valid: {self.languages}")
        return language

    def transcribe(
        self,
        audio: Float32Array,
        *,
        language: str | None = None,
        partial: bool = False,
        options: AsrOptions | None = None,
    ) -> AsrResult:
        lang = self._language(language)
        result: AsrResult = self.client.call(
            "transcribe", lang, self.config.asr_timeout_s, audio, lang, partial, options
        )
        return result

    def transcribe_many(
        self,
        audios: Sequence[Float32Array],
        *,
        language: str | None = None,
        partial: bool = False,
        options: AsrOptions | None = None,
    ) -> list[AsrResult]:
        """One remote call for a cross-session batch (pipeline/scheduling/asr_batch.py)."""
        lang = self._language(language)
        results: list[AsrResult] = self.client.call(
            "transcribe_many", lang, self.config.asr_timeout_s, list(audios), lang, options
        )
        return results

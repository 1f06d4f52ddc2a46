"""The core tier: ASR and TTS as Ray Serve deployments, multiplexed by language and voice.

Each deployment is its own Serve application (`<app_name>-asr`, `<app_name>-tts`), so the
tiers are deployed, scaled and deleted apart. The multiplexed model id routes a request to a
replica that already holds the model (an ASR language, a TTS voice); a replica loads up to
`max_models_per_replica` of them. Model calls are blocking, so they run on the replica's
threads (`asyncio.to_thread`) and `max_ongoing_requests` calls can run at once; TTS streams
its chunks back as an async generator, pulled one chunk per thread hop, so a cancelled
request (barge-in, a client gone) stops between chunks.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial as partial_call
from typing import Any

from ray import serve
from ray.serve.deployment import Application

from voxserve.cluster.connect import ASR_DEPLOYMENT, TTS_DEPLOYMENT
from voxserve.cluster.core_engines import (
    Loaded,
    TtsCatalogue,
    TtsEngineEntry,
    build_engine,
)
from voxserve.config import ClusterConfig, ClusterDeployment, EnginesConfig, load_settings
from voxserve.engines.base import (
    Float32Array,
    Int16Array,
    asr_tasks,
    close_engine,
    first_piece_choice,
)
from voxserve.pipeline.synthesis.engine_chunks import LockedChunks
from voxserve.types import AsrOptions, AsrResult

Loader = Callable[[str], Awaitable[Loaded]]


def _multiplexed(load: Callable[[str], Loaded], max_models: int) -> Loader:
    """Serve's multiplexing cache around a blocking loader (run on a thread)."""

    async def load_model(model_id: str) -> Loaded:
        return await asyncio.to_thread(load, model_id)

    wrapped: Loader = serve.multiplexed(max_num_models_per_replica=max_models)(load_model)
    return wrapped


def _where(loaded: set[str]) -> dict[str, Any]:
    """Which replica answered (for `voxserve cluster status` and the affinity tests)."""
    import ray

    context = serve.get_replica_context()
    return {
        "replica": context.replica_id.unique_id,
        "node": ray.get_runtime_context().get_node_id(),
        "pid": os.getpid(),
        "loaded": sorted(loaded),
    }


@serve.deployment(name=ASR_DEPLOYMENT)
class AsrCore:
    """Whole-buffer recognition; the multiplexed model id is the language."""

    def __init__(self, engines: dict[str, Any], cluster: dict[str, Any]) -> None:
        self._engines = EnginesConfig.model_validate(engines)
        self._cluster = ClusterConfig.model_validate(cluster)
        self._loaded: set[str] = set()
        self._spare: Any = None  # the default engine, built by describe() before any load
        self._lock = threading.Lock()
        self._load = _multiplexed(self._build, self._cluster.asr.max_models_per_replica)

    def _default(self) -> Any:
        with self._lock:
            if self._spare is None:
                self._spare = build_engine("asr", self._engines.asr, self._engines.default_threads)
            return self._spare

    def _build(self, language: str) -> Loaded:
        spec = self._cluster.asr_languages.get(language)
        if spec is None:
            with self._lock:
                engine, self._spare = self._spare, None
            if engine is None:
                engine = build_engine("asr", self._engines.asr, self._engines.default_threads)
        else:
            engine = build_engine("asr", spec, self._engines.default_threads)
        if language not in engine.languages:
            close_engine(engine)
            raise ValueError(f"language {language!r} is not served")
        self._loaded.add(language)
        return Loaded(language, engine, self._loaded.discard)

    async def describe(self) -> dict[str, Any]:
        """The languages served (the default engine's first is the default), its tasks
        (transcribe, translate) and its info."""
        engine = await asyncio.to_thread(self._default)
        languages = list(engine.languages)
        languages += [lang for lang in self._cluster.asr_languages if lang not in languages]
        return {"info": engine.info, "languages": tuple(languages), "tasks": asr_tasks(engine)}

    async def transcribe(
        self,
        audio: Float32Array,
        language: str,
        partial: bool = False,
        options: AsrOptions | None = None,
    ) -> AsrResult:
        loaded = await self._load(serve.get_multiplexed_model_id() or language)
        engine = loaded.engine
        kwargs: dict[str, Any] = {"options": options} if options is not None else {}
        result: AsrResult = await asyncio.to_thread(
            partial_call(engine.transcribe, audio, language=language, partial=partial, **kwargs)
        )
        return result

    async def transcribe_many(
        self, audios: list[Float32Array], language: str, options: AsrOptions | None = None
    ) -> list[AsrResult]:
        """One engine batch (whisper: shared encoder runs), as the in-process AsrBatcher."""
        loaded = await self._load(serve.get_multiplexed_model_id() or language)
        engine = loaded.engine
        many = getattr(engine, "transcribe_many", None)
        kwargs: dict[str, Any] = {"options": options} if options is not None else {}

        def run() -> list[AsrResult]:
            if callable(many):
                return list(many(audios, language=language, partial=False, **kwargs))
            return [engine.transcribe(audio, language=language, **kwargs) for audio in audios]

        return await asyncio.to_thread(run)

    async def where(self) -> dict[str, Any]:
        return _where(self._loaded)


@serve.deployment(name=TTS_DEPLOYMENT)
class TtsCore:
    """Streaming synthesis; the multiplexed model id is the voice."""

    def __init__(self, engines: dict[str, Any], cluster: dict[str, Any]) -> None:
        self._engines = EnginesConfig.model_validate(engines)
        self._cluster = ClusterConfig.model_validate(cluster)
        self._catalogue: TtsCatalogue | None = None
        self._lock = threading.Lock()
        self._loaded: set[str] = set()
        self._load = _multiplexed(self._build, self._cluster.tts.max_models_per_replica)
        self.completed = 0
        self.cancelled = 0

    def _read_catalogue(self) -> TtsCatalogue:
        with self._lock:
            if self._catalogue is None:
                self._catalogue = TtsCatalogue.read(self._engines)
            return self._catalogue

    def _build(self, voice: str) -> Loaded:
        catalogue = self._read_catalogue()
        with self._lock:
            engine = catalogue.engine_for(voice, self._engines.default_threads)
        self._loaded.add(voice)
        return Loaded(voice, engine, self._loaded.discard)

    async def describe(self) -> list[TtsEngineEntry]:
        catalogue = await asyncio.to_thread(self._read_catalogue)
        return list(catalogue.engines.values())

    async def synthesize(
        self, text: str, voice: str, speed: float = 1.0, short_first: bool = True, skip: int = 0
    ) -> AsyncIterator[Int16Array]:
        """The engine's chunks, after the first `skip` (a stream resumed on this replica
        after its first replica was lost: engines cut at text boundaries, so chunk k is
        the same piece of text on any replica). `short_first`: the gateway's first-piece
        choice, for an engine that offers it (engines/base.py, short_first_piece)."""
        chunks: LockedChunks | None = None
        index = 0
        finished = False
        try:
            # Inside the try: a call cancelled while its voice loads (a replica's first
            # call for it, on a busy machine longer than a chunk's deadline) is counted.
            loaded = await self._load(serve.get_multiplexed_model_id() or voice)
            first = first_piece_choice(loaded.engine, short_first)
            chunks = LockedChunks(loaded.engine.synthesize(text, voice=voice, speed=speed, **first))
            while True:
                chunk = await asyncio.to_thread(chunks.next_chunk)
                if chunk is None:
                    finished = True
                    break
                if index >= skip:
                    yield chunk
                index += 1
        finally:
            if finished:
                self.completed += 1
            else:
                self.cancelled += 1
            if chunks is not None:
                # Closing waits for a chunk still being made: never on the replica's loop.
                threading.Thread(target=chunks.close, name="voxserve-tts-close").start()

    async def where(self) -> dict[str, Any]:
        return _where(self._loaded) | {"completed": self.completed, "cancelled": self.cancelled}


def deployment_options(config: ClusterDeployment) -> dict[str, Any]:
    """voxserve's settings of one tier as Ray Serve deployment options."""
    actor: dict[str, Any] = {"num_cpus": config.num_cpus}
    if config.num_gpus > 0:  # Ray places the replica on a node with that much GPU free
        actor["num_gpus"] = config.num_gpus
    options: dict[str, Any] = {
        "ray_actor_options": actor,
        "max_ongoing_requests": config.max_ongoing_requests,
        "max_queued_requests": config.max_queued_requests,
    }
    if config.max_replicas_per_node is not None:
        options["max_replicas_per_node"] = config.max_replicas_per_node
    if config.autoscaling is not None:
        options["autoscaling_config"] = dict(config.autoscaling)
    else:
        options["num_replicas"] = config.num_replicas
    return options


def _args(engines: EnginesConfig, cluster: ClusterConfig) -> tuple[dict[str, Any], ...]:
    return engines.model_dump(mode="json"), cluster.model_dump(mode="json")


def asr_application(engines: EnginesConfig, cluster: ClusterConfig) -> Application:
    return _bind(AsrCore, cluster.asr, engines, cluster)


def tts_application(engines: EnginesConfig, cluster: ClusterConfig) -> Application:
    return _bind(TtsCore, cluster.tts, engines, cluster)


def _bind(
    deployment: Any, tier: ClusterDeployment, engines: EnginesConfig, cluster: ClusterConfig
) -> Application:
    """`deployment` is a serve.Deployment (typed Any: the decorator hides it from mypy)."""
    app: Application = deployment.options(**deployment_options(tier)).bind(*_args(engines, cluster))
    return app


def _settings_from(args: dict[str, str]) -> tuple[EnginesConfig, ClusterConfig]:
    settings = load_settings(args.get("config") or None)
    return settings.engines, settings.cluster


def build_asr_app(args: dict[str, str]) -> Application:
    """Serve application builder (`import_path` of a RayService): `args.config` is a
    voxserve config file on the cluster's image; VOXSERVE_* env vars apply as usual."""
    return asr_application(*_settings_from(args))


def build_tts_app(args: dict[str, str]) -> Application:
    """As build_asr_app, for the TTS tier."""
    return tts_application(*_settings_from(args))

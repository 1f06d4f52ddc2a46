"""What a lease on a named model sees: a view of the engine generation with the model in place.

Apart from the table (table.py) because a view is a `Generation` to the pipeline, with the
generation's own rules (leases held by sessions, retirement, closing): the table decides
which models are loaded and which views exist; a view only swaps engines and counts uses.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from typing import Any, cast

from voxserve.engines.loaded import Engines
from voxserve.pipeline.generations import Batching, Generation, Lease
from voxserve.pipeline.models.names import ModelEntry
from voxserve.pipeline.scheduling.vad_batch import VadBatcher


class Model:
    """One named model: loading, or loaded and counted."""

    def __init__(self, entry: ModelEntry, ready: asyncio.Future[None]) -> None:
        self.entry = entry
        self.ready = ready  # done when loaded (or failed: VoxError MODEL_UNAVAILABLE)
        self.engine: Any = None
        self.bytes = 0  # RSS its load added
        self.load_s = 0.0
        self.uses = 0  # leases (and requests waiting for the load) holding it
        self.last_used = time.monotonic()
        self.expiry: asyncio.TimerHandle | None = None

    @property
    def loaded(self) -> bool:
        return self.ready.done() and not self.ready.cancelled() and self.engine is not None

    def stop_expiry(self) -> None:
        """Cancel the idle TTL's pending unload, if any."""
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None


class ModelView(Generation):
    """A generation's engines with named models in place of its ASR / TTS. It holds the
    generation (every lease on the view holds one on it) and its models (in use while a
    lease is held); it owns no engine: closing it closes its own ASR batcher only."""

    def __init__(
        self,
        base: Generation,
        models: tuple[Model, ...],
        batching: Batching,
        released: Callable[[Model], None],
    ) -> None:
        engines: Engines = base.engines
        for model in models:
            if model.entry.kind == "asr":
                engines = replace(engines, asr=model.engine)
            else:
                engines = replace(engines, tts=[model.engine])
        super().__init__(base.number, engines, batching)
        self.base = base
        self.models = models
        self._released = released

    def vad_batcher(self) -> VadBatcher:
        return self.base.vad_batcher()  # the VAD is the generation's: its batches shared

    def lease(self) -> Lease:
        base_lease = self.base.lease()
        for model in self.models:
            model.uses += 1
        self.sessions += 1
        self.sessions_total += 1
        return _ViewLease(self, base_lease)

    def _release_view(self, base_lease: Lease) -> None:
        self.sessions -= 1
        for model in self.models:
            self._released(model)
        base_lease.release()
        if self.retired and self.sessions == 0 and self.on_unused is not None:
            self.on_unused(self)

    def close_engines(self, keep: Iterable[Engines] = ()) -> None:
        """The engines are the generation's and the table's: only the references go."""
        self.closed = True
        self.engines = cast(Engines, None)  # drop the references (generations.py says why)
        self._vad_batcher = self._asr_batcher = None
        self._batching = None
        self.on_unused = None


class _ViewLease(Lease):
    """A lease on a view: released, it gives back the view, its models and the generation."""

    def __init__(self, view: ModelView, base_lease: Lease) -> None:
        self.generation = view
        self._finalizer = weakref.finalize(self, partial(view._release_view, base_lease))

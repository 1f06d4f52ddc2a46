"""Named models a request chooses (`[models]`, settings.models): loaded on first use, kept
by an LRU within a memory bound and an idle TTL, never unloaded while a request or a session
uses one, never the defaults.

A request or session that names a model is given a `Lease` on a *view* of the current
engine generation: the same engines (VAD and its batcher, TTS, responder) with the named
ASR (or TTS) engine in place and an ASR batcher of its own. The pipeline reads only what it
is given (`ctx.engines`, `ctx.asr_batcher()`), so nothing is looked up per frame: the model
is chosen once, when the request or session starts (a Realtime `session.update` may choose
again: `Lease.take_over`, between turns). The defaults (`engines.asr`, `engines.tts`) are
the generation's own: a name that means them is a plain lease on the generation.

A load runs in a thread of its own (a download may take minutes; the event loop and the
model executor never wait on it), one load at a time, so the RSS it adds is what the model
holds: the size the memory bound counts. Concurrent first requests for one model share its
one load.

This module is the table: which models are loaded (pinned by leases, an LRU within the
memory bound, the idle TTL) and unloading them. Its parts: names.py (what a name means:
pure, loads nothing), views.py (the engines a lease sees), loading.py (the load thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from voxserve.config import Settings
from voxserve.engines.base import asr_tasks, close_engine
from voxserve.engines.loaded import Engines
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.pipeline.generations import Batching, Generation, Lease, until_idle
from voxserve.pipeline.models.loading import load_failure, start_load
from voxserve.pipeline.models.names import ModelEntry, ModelKind, ModelNames
from voxserve.pipeline.models.views import Model, ModelView

log = logging.getLogger(__name__)


class ModelTable:
    """The named models of settings.models (module docstring)."""

    def __init__(
        self,
        settings: Settings,
        batching: Batching,
        *,
        generation: Callable[[], Generation],
        running_work: Callable[[], int],
        close_grace_s: float = 15.0,
    ) -> None:
        self.settings = settings
        self._batching = batching
        self._generation = generation
        self._running_work = running_work
        self._close_grace_s = close_grace_s
        self.ttl = settings.models.ttl
        self.max_bytes = settings.models.max_loaded_bytes
        self.catalog = ModelNames(settings)  # what a name means (names.py)
        self._models: dict[str, Model] = {}
        self._views: dict[tuple[int, tuple[str, ...]], ModelView] = {}
        self._load_lock = threading.Lock()  # one load at a time: its RSS growth is its own
        self._closers: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Engines built, by name (concurrent first uses of a model load it once).
        self.loads: dict[str, int] = {}
        # The most RSS a load of each name added: a reload can reuse the pages the allocator
        # kept from its last unload and add ~0, which would let it hide from the bound.
        self._measured: dict[str, int] = {}
        self.unloads = 0
        self.closed = False

    # -- names ---------------------------------------------------------------------------

    def bind_defaults(self, engines: Engines | None) -> None:
        """ModelNames.bind_defaults: the default ASR's own model name, once loaded."""
        self.catalog.bind_defaults(engines)

    def entry(self, kind: ModelKind, name: str | None) -> ModelEntry:
        """What a request's `model` means (ModelNames.entry): `unknown_model` if nothing."""
        return self.catalog.entry(kind, name)

    def names(self, kind: ModelKind | None = None) -> list[str]:
        return self.catalog.names(kind)

    def entries(self) -> list[ModelEntry]:
        return self.catalog.entries()

    def check(self) -> None:
        """ModelNames.check: every entry's engine exists and takes its options."""
        self.catalog.check()

    def loaded_engine(self, entry: ModelEntry) -> Any:
        """The engine of a loaded named model (None: not loaded; defaults: the generation's)."""
        if entry.default:
            engines = self._generation().engines
            return engines.asr if entry.kind == "asr" else None
        model = self._models.get(entry.name)
        return model.engine if model is not None and model.loaded else None

    def can_translate(self, entry: ModelEntry) -> bool | None:
        """Whether the model translates: known once loaded; before that an English-only
        Whisper name (`*.en`) cannot, another Whisper can; other engines: None (unknown)."""
        if entry.kind != "asr":
            return False
        engine = self.loaded_engine(entry)
        if engine is not None:
            return "translate" in asr_tasks(engine)
        if entry.engine == "whisper":
            return not entry.engine_model().endswith(".en")
        return None

    def first_multilingual_asr(self) -> ModelEntry | None:
        """The model a translation with no model of its own uses: the default if it can,
        else the first configured one that can."""
        default = self.catalog.defaults["asr"]
        if self.can_translate(default):
            return default
        for entry in self.catalog.named.values():
            if entry.kind == "asr" and not entry.default and self.can_translate(entry):
                return entry
        return None

    # -- leases --------------------------------------------------------------------------

    async def lease(self, *, asr: str | None = None, tts: str | None = None) -> Lease:
        """A lease on the current generation, or on a view of it with the named models in
        place (loaded first if they are not: `model_unavailable` when that fails). The
        models are in use, never unloaded, until the lease is released."""
        chosen = self._chosen(asr, tts)
        if not chosen:
            return self._generation().lease()
        models = [self._pin(entry) for entry in chosen]
        try:
            for model in models:
                await asyncio.shield(model.ready)
            return self._view(tuple(models)).lease()
        finally:
            for model in models:
                self._released(model)

    def lease_now(self, *, asr: str | None = None, tts: str | None = None) -> Lease:
        """`lease` for models already loaded (a caller holding a lease from `lease` keeps
        them so): no await, for the places that build a session synchronously."""
        chosen = self._chosen(asr, tts)
        if not chosen:
            return self._generation().lease()
        models: list[Model] = []
        for entry in chosen:
            model = self._models.get(entry.name)
            if model is None or not model.loaded:
                raise VoxError(
                    ErrorCode.MODEL_UNAVAILABLE, f"model {quoted(entry.name)} is not loaded"
                )
            models.append(model)
        return self._view(tuple(models)).lease()

    def _chosen(self, asr: str | None, tts: str | None) -> list[ModelEntry]:
        entries = [self.entry("asr", asr), self.entry("tts", tts)]
        return [entry for entry in entries if not entry.default]

    def _pin(self, entry: ModelEntry) -> Model:
        """The model, in use by the caller (`_released` gives it back); its load started if
        it is neither loaded nor loading."""
        if self.closed:
            raise VoxError(ErrorCode.SHUTTING_DOWN, "the server is shutting down")
        model = self._models.get(entry.name)
        if model is None:
            loop = self._loop = asyncio.get_running_loop()
            model = self._models[entry.name] = Model(entry, loop.create_future())
            self._start_load(model, loop)
        model.stop_expiry()
        model.uses += 1
        return model

    def _view(self, models: tuple[Model, ...]) -> ModelView:
        base = self._generation()
        key = (base.number, tuple(m.entry.name for m in models))
        view = self._views.get(key)
        if view is None or view.retired or view.closed:
            self._retire_stale_views()
            view = ModelView(base, models, self._batching, self._released)
            view.on_unused = self._view_unused
            self._views[key] = view
        return view

    def _retire_stale_views(self) -> None:
        """Views of a retired generation take no new lease (their sessions finish there)."""
        for key, view in list(self._views.items()):
            gone = any(self._models.get(m.entry.name) is not m for m in view.models)
            if gone or view.base.retired:
                del self._views[key]
                view.retire()

    def _view_unused(self, generation: Generation) -> None:
        generation.close_batchers()
        generation.close_engines()

    def _released(self, model: Model) -> None:
        """One use of `model` ended: unloaded now (ttl 0), later (ttl > 0) or never (-1)
        once it is idle; and the idle ones that exceed the memory bound. A lease collected
        off the loop's thread (a finalizer) hands the rest to the loop."""
        model.uses -= 1
        model.last_used = time.monotonic()
        if model.uses > 0 or not model.loaded or self._models.get(model.entry.name) is not model:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._idle, model)
            return
        self._idle(model)

    def _idle(self, model: Model) -> None:
        if model.uses > 0 or self._models.get(model.entry.name) is not model:
            return
        if self.ttl == 0:
            self._unload(model, "ttl")
            return
        if self.ttl > 0:
            loop = asyncio.get_running_loop()
            model.expiry = loop.call_later(self.ttl, self._expire, model)
        self._fit_budget()

    def _expire(self, model: Model) -> None:
        model.expiry = None
        if model.uses == 0 and self._models.get(model.entry.name) is model:
            self._unload(model, "ttl")

    def _fit_budget(self, keep: Model | None = None) -> None:
        """Unload the least recently used idle models while the loaded ones hold more than
        `max_loaded_bytes` (0: no bound). One in use stays: the bound holds once it is idle."""
        if self.max_bytes <= 0:
            return
        loaded = [m for m in self._models.values() if m.loaded]
        total = sum(m.bytes for m in loaded)
        idle = sorted(
            (m for m in loaded if m.uses == 0 and m is not keep), key=lambda m: m.last_used
        )
        while total > self.max_bytes and idle:
            model = idle.pop(0)
            total -= model.bytes
            self._unload(model, "memory")

    def _unload(self, model: Model, why: str) -> None:
        """Forget `model` (its views retire) and close its engine once no stage is running
        a call that may still be inside it (or after the grace)."""
        if self._models.get(model.entry.name) is model:
            del self._models[model.entry.name]
        model.stop_expiry()
        self._retire_stale_views()
        self.unloads += 1
        log.info(
            "model unloaded",
            extra={"model": model.entry.name, "reason": why, "bytes": model.bytes},
        )
        engine, model.engine = model.engine, None
        if engine is None:
            return
        task = asyncio.get_running_loop().create_task(
            self._close_later(engine), name="voxserve-close-model"
        )
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)

    async def _close_later(self, engine: Any) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await until_idle(self._running_work, self._close_grace_s)
        await asyncio.to_thread(close_engine, engine)

    # -- loading -------------------------------------------------------------------------

    def _start_load(self, model: Model, loop: asyncio.AbstractEventLoop) -> None:
        """Build the engine off the loop (loading.py); the result is delivered on the loop."""
        entry = model.entry

        def deliver(engine: Any, grown: int, took: float, error: BaseException | None) -> None:
            if error is not None:
                self._load_failed(model, error)
            elif self.closed or self._models.get(entry.name) is not model:
                close_engine(engine)  # nobody will use it (shutdown)
            else:
                grown = max(grown, self._measured.get(entry.name, 0))
                self._measured[entry.name] = grown
                model.engine, model.bytes, model.load_s = engine, grown, took
                self.loads[entry.name] = self.loads.get(entry.name, 0) + 1
                model.ready.set_result(None)
                log.info(
                    "model loaded",
                    extra={"model": entry.name, "seconds": round(took, 3), "bytes": grown},
                )
                self._fit_budget(keep=model)

        start_load(self.settings, entry, self._load_lock, loop, deliver)

    def _load_failed(self, model: Model, error: BaseException) -> None:
        if self._models.get(model.entry.name) is model:
            del self._models[model.entry.name]  # the next request tries again
        reason, refusal = load_failure(model.entry, error)
        log.error("model load failed", extra={"model": model.entry.name, "error": reason})
        model.ready.set_exception(refusal)
        model.ready.exception()  # retrieved: no "never retrieved" warning when none waits

    # -- status and shutdown -------------------------------------------------------------

    def loaded_names(self) -> list[str]:
        return [name for name, m in self._models.items() if m.loaded]

    def status(self) -> list[dict[str, Any]]:
        """The named models loaded or loading (GET /debug and the tests)."""
        return [
            {
                "name": name,
                "loaded": m.loaded,
                "uses": m.uses,
                "bytes": m.bytes,
                "load_seconds": round(m.load_s, 3),
                "idle_s": round(time.monotonic() - m.last_used, 3),
            }
            for name, m in self._models.items()
        ]

    def close(self) -> None:
        """Close every named model and view (shutdown: nothing runs any more)."""
        self.closed = True
        for task in list(self._closers):
            task.cancel()
        for view in self._views.values():
            view.close_batchers()
            view.close_engines()
        self._views.clear()
        for model in self._models.values():
            model.stop_expiry()
            if model.engine is not None:
                close_engine(model.engine)
                model.engine = None
        self._models.clear()

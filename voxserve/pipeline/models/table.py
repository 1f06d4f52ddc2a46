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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal, cast

from voxserve.config import EngineSpec, ModelSpec, Settings
from voxserve.engines.base import asr_tasks, close_engine
from voxserve.engines.loaded import Engines, build_engine
from voxserve.engines.registry import (
    EngineConfigError,
    EngineNotFound,
    check_options,
    engine_class,
    option_names,
)
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.observe.process_memory import rss_bytes
from voxserve.pipeline.generations import Batching, Generation, Lease, until_idle
from voxserve.pipeline.scheduling.vad_batch import VadBatcher

log = logging.getLogger(__name__)

ModelKind = Literal["asr", "tts"]

# OpenAI's model names, which mean the default engines so the official SDK works unchanged
# (unless a [models] entry claims one). The SDK's AudioModel names but
# `gpt-4o-transcribe-diarize`, whose point (speakers, `diarized_json`) the engines lack.
OPENAI_TTS_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")
OPENAI_ASR_MODELS = (
    "whisper-1",
    "gpt-transcribe",
    "gpt-4o-transcribe",
    "gpt-4o-mini-transcribe",
    "gpt-4o-mini-transcribe-2025-12-15",
)
NAMED_OPTIONS = ("model", "voice")  # the option an entry's name fills when it is not set


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """A name a request may give: a configured model, or one of the defaults."""

    name: str
    kind: ModelKind
    engine: str
    options: Mapping[str, Any] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    default: bool = False

    def engine_model(self) -> str:
        """The weights the name runs on, as configured (before loading)."""
        for key in (*NAMED_OPTIONS, "model_path"):
            if key in self.options:
                return str(self.options[key])
        return self.name


def named_entries(specs: Mapping[str, ModelSpec]) -> dict[str, ModelEntry]:
    return {
        name: ModelEntry(
            name, spec.kind, spec.engine_name(), dict(spec.options), tuple(spec.aliases)
        )
        for name, spec in specs.items()
    }


def filled_options(entry: ModelEntry, cls: Any) -> dict[str, Any]:
    """The entry's options, its name given as the first of NAMED_OPTIONS the engine takes
    when that is not set (`[models.named."small.en"]` alone is Whisper small.en)."""
    options = dict(entry.options)
    takes = option_names(cls) or []
    for key in NAMED_OPTIONS:
        if key in takes:
            options.setdefault(key, entry.name)
            break
    return options


class _Model:
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
        models: tuple[_Model, ...],
        batching: Batching,
        released: Callable[[_Model], None],
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
        self._named = named_entries(settings.models.named)
        self._labels: dict[tuple[ModelKind, str], str] = {}
        for entry in self._named.values():
            for label in (entry.name, *entry.aliases):
                self._labels[(entry.kind, label)] = entry.name
        self._defaults: dict[ModelKind, ModelEntry] = {}
        self._default_labels: dict[ModelKind, set[str]] = {"asr": set(), "tts": set()}
        self.bind_defaults(None)
        self._models: dict[str, _Model] = {}
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
        """The names that mean the default engines: the OpenAI names, the engine names, and
        (once loaded) the default ASR's own model name (`tiny.en`, which Realtime reports)."""
        cfg = self.settings.engines
        asr_labels = {*OPENAI_ASR_MODELS, cfg.asr.name, "whisper"}
        tts_labels = {*OPENAI_TTS_MODELS, *(spec.name for spec in cfg.tts)}
        asr_model = ""
        if engines is not None:
            asr_model = engines.asr.info.model or ""
            if asr_model:
                asr_labels.add(asr_model)
        tts_name = cfg.tts[0].name if cfg.tts else "tts"
        self._defaults = {
            "asr": ModelEntry(cfg.asr.name, "asr", cfg.asr.name, dict(cfg.asr.options),
                              tuple(sorted(asr_labels - {cfg.asr.name})), default=True),
            "tts": ModelEntry(tts_name, "tts", tts_name, {}, tuple(sorted(tts_labels)),
                              default=True),
        }  # fmt: skip
        self._default_labels = {"asr": asr_labels, "tts": tts_labels}
        # An entry configured as the default ASR itself is the default, not a second copy.
        same = dict(cfg.asr.options)
        if asr_model:
            same.setdefault("model", asr_model)
        for entry in self._named.values():
            if (
                entry.kind == "asr"
                and entry.engine == cfg.asr.name
                and dict(entry.options, model=entry.engine_model()) == same
            ):
                self._named[entry.name] = replace(entry, default=True)

    def entry(self, kind: ModelKind, name: str | None) -> ModelEntry:
        """What a request's `model` means (None or "": the default). Loads nothing.
        Unknown: `unknown_model`, listing the names `kind` serves."""
        if not name:
            return self._defaults[kind]
        found = self._labels.get((kind, name))
        if found is not None:
            entry = self._named[found]
            return self._defaults[kind] if entry.default else entry
        if name in self._default_labels[kind] or name == self._defaults[kind].name:
            return self._defaults[kind]
        valid = ", ".join(self.names(kind))
        raise VoxError(
            ErrorCode.UNKNOWN_MODEL, f"unknown {kind} model {quoted(name)}; valid models: {valid}"
        )

    def names(self, kind: ModelKind | None = None) -> list[str]:
        """Every name a request may give for `kind` (all kinds: None), sorted."""
        out: set[str] = set()
        for k in ("asr", "tts"):
            if kind in (None, k):
                out |= self._default_labels[k] | {self._defaults[k].name}
                out |= {label for (lk, label) in self._labels if lk == k}
        return sorted(out)

    def entries(self) -> list[ModelEntry]:
        """The defaults, then the configured models (for /v1/models); a configured one that
        is the default ASR itself says so (`default`)."""
        return [self._defaults["asr"], self._defaults["tts"], *self._named.values()]

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
        default = self._defaults["asr"]
        if self.can_translate(default):
            return default
        for entry in self._named.values():
            if entry.kind == "asr" and not entry.default and self.can_translate(entry):
                return entry
        return None

    def check(self) -> None:
        """Every entry's engine exists and takes its options (the signature only: nothing is
        loaded): EngineConfigError, so `serve` stops with one line, exit 2."""
        for entry in self._named.values():
            where = f"[models.named.{entry.name}]"
            try:
                cls = engine_class(entry.kind, entry.engine)
            except (EngineNotFound, ImportError) as exc:
                raise EngineConfigError(entry.kind, entry.engine, f"{where}: {exc}") from None
            try:
                check_options(entry.kind, entry.engine, cls, filled_options(entry, cls))
            except EngineConfigError as exc:
                raise EngineConfigError(entry.kind, entry.engine, f"{where}: {exc}") from None

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
        models: list[_Model] = []
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

    def _pin(self, entry: ModelEntry) -> _Model:
        """The model, in use by the caller (`_released` gives it back); its load started if
        it is neither loaded nor loading."""
        if self.closed:
            raise VoxError(ErrorCode.SHUTTING_DOWN, "the server is shutting down")
        model = self._models.get(entry.name)
        if model is None:
            loop = self._loop = asyncio.get_running_loop()
            model = self._models[entry.name] = _Model(entry, loop.create_future())
            self._start_load(model, loop)
        model.stop_expiry()
        model.uses += 1
        return model

    def _view(self, models: tuple[_Model, ...]) -> ModelView:
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

    def _released(self, model: _Model) -> None:
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

    def _idle(self, model: _Model) -> None:
        if model.uses > 0 or self._models.get(model.entry.name) is not model:
            return
        if self.ttl == 0:
            self._unload(model, "ttl")
            return
        if self.ttl > 0:
            loop = asyncio.get_running_loop()
            model.expiry = loop.call_later(self.ttl, self._expire, model)
        self._fit_budget()

    def _expire(self, model: _Model) -> None:
        model.expiry = None
        if model.uses == 0 and self._models.get(model.entry.name) is model:
            self._unload(model, "ttl")

    def _fit_budget(self, keep: _Model | None = None) -> None:
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

    def _unload(self, model: _Model, why: str) -> None:
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

    def _start_load(self, model: _Model, loop: asyncio.AbstractEventLoop) -> None:
        """Build the engine in a daemon thread (a server stopped mid-download exits at
        once); the result is delivered on the loop."""
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

        def run() -> None:
            engine: Any = None
            grown, took, error = 0, 0.0, None
            try:
                engine, grown, took = self._build(entry)
            except BaseException as exc:  # delivered to the requests waiting for it
                error = exc
            try:
                loop.call_soon_threadsafe(deliver, engine, grown, took, error)
            except RuntimeError:  # the loop is closed
                if engine is not None:
                    close_engine(engine)

        threading.Thread(target=run, name="voxserve-load-model", daemon=True).start()

    def _build(self, entry: ModelEntry) -> tuple[Any, int, float]:
        cls = engine_class(entry.kind, entry.engine)
        spec = EngineSpec(name=entry.engine, options=filled_options(entry, cls))
        cfg = self.settings
        parallel = cfg.pipeline.asr.concurrency if entry.kind == "asr" else None
        with self._load_lock:
            before = rss_bytes()
            engine, took = build_engine(entry.kind, spec, cfg.engines.default_threads, parallel)
            grown = max(0, rss_bytes() - before)
        return engine, grown, took

    def _load_failed(self, model: _Model, error: BaseException) -> None:
        if self._models.get(model.entry.name) is model:
            del self._models[model.entry.name]  # the next request tries again
        reason = str(error) if isinstance(error, EngineConfigError | LookupError) else (
            f"{type(error).__name__}: {error}"
        )  # fmt: skip
        log.error("model load failed", extra={"model": model.entry.name, "error": reason})
        model.ready.set_exception(
            VoxError(
                ErrorCode.MODEL_UNAVAILABLE,
                f"model {quoted(model.entry.name)} could not be loaded: {reason}",
            )
        )
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

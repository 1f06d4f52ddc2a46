"""Loading a named model: in a daemon thread of its own, one load at a time, its RSS measured.

A load may take minutes (a download): the event loop and the model executor never wait on
it, and a server stopped mid-download exits at once. One load at a time, so the RSS a load
adds is what the model holds: the size the table's memory bound counts (table.py). RSS
growth under-counts a load that reuses heap the allocator kept from an earlier one (a
second tiny.en grew RSS by 16 KB where the first grew it 63 MB: the first load's read
buffer, freed but kept by malloc) and memory other threads free meanwhile: an engine that
knows its weights' size (`weights_bytes`: Whisper's model files) counts at least that. It
may over-count (a float16 file held as int8): the bound then unloads sooner, never later.

Apart from the table because this is the one part that runs off the event loop: it builds
the engine and hands the result back to the loop; what the table then does with it (count
it, fit the bound, wake the requests waiting) is the table's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from voxserve.config import EngineSpec, Settings
from voxserve.engines.base import close_engine
from voxserve.engines.loaded import build_engine
from voxserve.engines.registry import EngineConfigError, engine_class
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.observe.process_memory import rss_bytes
from voxserve.pipeline.models.names import ModelEntry, filled_options

# (engine, RSS grown, seconds, error): called on the loop with the load's outcome
Deliver = Callable[[Any, int, float, BaseException | None], None]


def start_load(
    settings: Settings,
    entry: ModelEntry,
    lock: threading.Lock,
    loop: asyncio.AbstractEventLoop,
    deliver: Deliver,
) -> None:
    """Build `entry`'s engine in a daemon thread, holding `lock` (the table's: one load at a
    time, so its RSS growth is its own); the result is delivered on the loop (a loop closed
    by then: the engine is closed, nothing delivered)."""

    def run() -> None:
        engine: Any = None
        grown, took, error = 0, 0.0, None
        try:
            engine, grown, took = _build(settings, entry, lock)
        except BaseException as exc:  # delivered to the requests waiting for it
            error = exc
        try:
            loop.call_soon_threadsafe(deliver, engine, grown, took, error)
        except RuntimeError:  # the loop is closed
            if engine is not None:
                close_engine(engine)

    threading.Thread(target=run, name="voxserve-load-model", daemon=True).start()


def _build(settings: Settings, entry: ModelEntry, lock: threading.Lock) -> tuple[Any, int, float]:
    cls = engine_class(entry.kind, entry.engine)
    spec = EngineSpec(name=entry.engine, options=filled_options(entry, cls))
    parallel = settings.pipeline.asr.concurrency if entry.kind == "asr" else None
    with lock:
        before = rss_bytes()
        engine, took = build_engine(entry.kind, spec, settings.engines.default_threads, parallel)
        grown = max(0, rss_bytes() - before, int(getattr(engine, "weights_bytes", 0)))
    return engine, grown, took


def load_failure(entry: ModelEntry, error: BaseException) -> tuple[str, VoxError]:
    """Why a load failed (for the log) and what the requests waiting for it are told."""
    reason = str(error) if isinstance(error, EngineConfigError | LookupError) else (
        f"{type(error).__name__}: {error}"
    )  # fmt: skip
    message = f"model {quoted(entry.name)} could not be loaded: {reason}"
    return reason, VoxError(ErrorCode.MODEL_UNAVAILABLE, message)

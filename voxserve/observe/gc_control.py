"""GC control: freeze what was loaded, and collect the young generations less often.

After the models load, everything alive (modules, engines, their numpy buffers' owners) is
moved to the permanent generation with `gc.freeze()`: later collections no longer walk
those objects (a full collection of a loaded server walks ~100k+ of them), and after a
fork (`serve --workers N`) the children do not write to those pages by scanning them, so
the pages stay shared. Thresholds are raised because the hot path allocates few container
objects per frame (frames go into pre-allocated rings), so generation 0 filling every 700
allocations only costs pauses; `gc.thresholds` sets them (docs/benchmarks.md has the
measured pauses). Pauses are observed by observe/gc_metrics.py.
"""

from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from voxserve.config import GcConfig

log = logging.getLogger(__name__)


def apply_thresholds(cfg: GcConfig) -> None:
    """Set the collector's thresholds from the settings (None keeps Python's)."""
    if cfg.thresholds is not None:
        gc.set_threshold(*cfg.thresholds)


def after_load(cfg: GcConfig) -> None:
    """Call once the engines are loaded (and again after a reload): thresholds, then one
    full collection and a freeze of what survived it."""
    apply_thresholds(cfg)
    if not cfg.freeze_after_load:
        return
    gc.collect()
    gc.freeze()
    log.info(
        "gc frozen after model load",
        extra={"frozen_objects": gc.get_freeze_count(), "thresholds": list(gc.get_threshold())},
    )

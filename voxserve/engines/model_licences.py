"""Which model licences forbid commercial use, and the one warning line a load of such a
model writes (issue 36, item 7).

A model's licence is free text (a package's License-Expression, a Hub model card's
`license`, an engine's `EngineInfo.license`): "CC BY-NC-SA 4.0", "cc-by-nc-4.0",
"non-commercial", "Creative Commons Attribution-NonCommercial". The warning names the
model and its licence, never anything a user sent, and is written once per model and
process (a hot reload or a second worker does not repeat it).
"""

from __future__ import annotations

import logging
import re
import threading

log = logging.getLogger(__name__)

_NON_COMMERCIAL = re.compile(r"(?<![a-z])(?:by-nc|nc-|non-?commercial)|\bNC\b", re.IGNORECASE)
_warned: set[str] = set()
_lock = threading.Lock()


def is_non_commercial(licence: str) -> bool:
    """Whether `licence` (free text) restricts the model to non-commercial use."""
    return bool(_NON_COMMERCIAL.search(licence))


def warn_non_commercial(what: str, licence: str, *, non_commercial: bool | None = None) -> bool:
    """Log one warning when the model `what` is non-commercial (`non_commercial`, or when
    None, judged from `licence`); True when it is."""
    flagged = is_non_commercial(licence) if non_commercial is None else non_commercial
    if not flagged:
        return False
    with _lock:
        if what in _warned:
            return True
        _warned.add(what)
    log.warning(
        "model %s is licensed %s: non-commercial use only",
        what,
        licence,
        extra={"model": what, "licence": licence},
    )
    return True

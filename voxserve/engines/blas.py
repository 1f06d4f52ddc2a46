"""Cap the threads of numpy's bundled OpenBLAS, which otherwise starts one per core.

Engines run on executor threads with one intra-op thread each, so N concurrent calls use N
cores. numpy's BLAS pool breaks that rule: Whisper's mel features (a matrix product per call)
wake it, and its idle workers spin before they sleep. Measured on the 2-core dev VM: 39 ms of
spinning per utterance next to 115 ms of Whisper work (docs/benchmarks.md, "Issue 12").
The pool is process-wide, so the cap is too; nothing in the server needs a parallel BLAS.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

log = logging.getLogger(__name__)

# Entry points of OpenBLAS builds: numpy's wheels (scipy-openblas, 64-bit ints), then plain.
_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)


def _loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process (after numpy's import)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:  # not Linux: leave BLAS as it is
        return []
    paths = {line.split()[-1] for line in lines if "openblas" in line.lower() and "/" in line}
    return sorted(paths)


def limit_blas_threads(threads: int) -> bool:
    """Set every loaded OpenBLAS to `threads` threads; False if none could be set."""
    import numpy  # noqa: F401 (maps numpy's BLAS into the process)

    done = False
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(ctypes.c_int(max(1, threads)))
                done = True
                break
    if not done:
        log.debug("no OpenBLAS thread setter found; BLAS threads left as they are")
    return done

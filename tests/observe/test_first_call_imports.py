"""Modules that libraries import inside their first call, which the server would run on its
event loop: imported with the voxserve module that makes the call, so no stream stalls on
the first session's import (found by the hostile tests' loop watchdog: numpy.ma, ~0.1 s
quiet and ~0.4 s on a busy CI machine, in the first turn's np.median)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# (the voxserve module whose code makes the first call, what the library imports in it)
FIRST_CALL_IMPORTS = [
    ("voxserve.pipeline.turns.endpointing", "numpy.ma"),  # np.median's NaN check
    ("voxserve.server.webrtc.peer", "cryptography.hazmat.primitives.serialization"),  # DTLS
]


@pytest.mark.parametrize(("module", "lazy"), FIRST_CALL_IMPORTS)
def test_a_first_call_import_comes_with_its_caller(module: str, lazy: str) -> None:
    """In a fresh interpreter: importing `module` has imported `lazy` already."""
    check = f"import sys, {module}; sys.exit(0 if {lazy!r} in sys.modules else 1)"
    assert subprocess.run([sys.executable, "-c", check], timeout=120).returncode == 0


def test_np_median_still_imports_numpy_ma_lazily() -> None:
    """The reason for the first: if numpy stops doing so, the preload can go."""
    check = (
        "import sys, numpy as np; assert 'numpy.ma' not in sys.modules; np.median(np.ones(3));"
        " sys.exit(0 if 'numpy.ma' in sys.modules else 1)"
    )
    assert subprocess.run([sys.executable, "-c", check], timeout=120).returncode == 0

"""SIGTERM as Ctrl-C, so `serve` and `cluster up` run the same clean-up for either signal."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType


def interrupt(signum: int, frame: FrameType | None) -> None:
    """A signal handler that raises KeyboardInterrupt (what SIGINT does by default)."""
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C. While uvicorn runs it handles both signals (graceful
    shutdown), then re-raises the signal with the handler it found: this one, so SIGTERM
    ends as KeyboardInterrupt too, not as death by signal."""
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

"""Closing an async stream that may not be a generator (a responder's or a synthesis's)."""

from __future__ import annotations


async def aclose(stream: object) -> None:
    """Stop `stream` now (between chunks; also when the client cancelled) if it can be
    closed: an async generator's `finally` blocks run here, not at garbage collection."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()

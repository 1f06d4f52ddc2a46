"""The ASGI application: health, OpenAI-compatible HTTP audio, voices, and /v1/stream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.routing import BaseRoute

from voxserve.runtime import Runtime
from voxserve.server import health, http_audio, ws_stream

log = logging.getLogger(__name__)


def create_app(runtime: Runtime) -> Starlette:
    """Build the app. Models load in the background: /healthz answers at once, /readyz
    (and sessions) only once every engine is loaded."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loader = asyncio.create_task(_load(runtime), name="voxserve-load-engines")
        try:
            yield
        finally:
            loader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loader
            await runtime.aclose()

    routes: list[BaseRoute] = [
        *health.routes(runtime),
        *http_audio.routes(runtime),
        *ws_stream.routes(runtime),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.runtime = runtime
    return app


async def _load(runtime: Runtime) -> None:
    try:
        await runtime.load()
    except Exception:
        # runtime.load_error is reported by /readyz; the process stays up to say so.
        log.exception("engines failed to load")

"""The ASGI application: health, OpenAI-compatible HTTP audio, voices, /v1/stream, the
OpenAI Realtime API (/v1/realtime, and WebRTC calls at /v1/realtime/calls), and the admin
routes of the TTS cache."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import BaseRoute

from voxserve.engines.registry import EngineConfigError
from voxserve.errors import ErrorCode
from voxserve.observe.loop_watchdog import LoopWatchdog
from voxserve.runtime import Runtime
from voxserve.server import health, web
from voxserve.server.host_guard import HostGuard, HostRule
from voxserve.server.http import admin as http_admin
from voxserve.server.http import admin_models as http_admin_models
from voxserve.server.http import admin_voices as http_admin_voices
from voxserve.server.http import audio as http_audio
from voxserve.server.http import debug as http_debug
from voxserve.server.http import engines as http_engines
from voxserve.server.http import memory as http_memory
from voxserve.server.http.guards import BodyTimeout, OriginGuard
from voxserve.server.realtime import client_secrets as realtime_client_secrets
from voxserve.server.realtime import stream as realtime_stream
from voxserve.server.session.request_id import REQUEST_ID_HEADER, TRACE_HEADER, RequestId
from voxserve.server.transports import Transports
from voxserve.server.webrtc.calls import CallService
from voxserve.server.ws import stream as ws_stream

log = logging.getLogger(__name__)


def create_app(runtime: Runtime) -> Starlette:
    """Build the app. Models load in the background: /healthz answers at once, /readyz
    (and sessions) only once every engine is loaded."""

    calls = CallService(runtime)  # WebRTC: POST /v1/realtime/calls and its live calls

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # anyio imports its asyncio backend on first use, which is a streamed response's
        # (~20 ms: what the first cache hit after a restart paid, docs/benchmarks.md): now.
        anyio.get_cancelled_exc_class()
        loader = asyncio.create_task(_load(runtime), name="voxserve-load-engines")
        watchdog = start_watchdog(runtime)
        http_engines.install_sighup(runtime)  # SIGHUP: hot reload of the engines
        # gRPC and Wyoming (ports in the settings; 0 = off) share this loop and runtime,
        # and stop before the engines close.
        transports = app.state.transports = Transports(runtime)
        runtime.flow.start()  # credit windows and load shedding tick while serving
        try:
            await transports.start()
            yield
        finally:
            await calls.aclose()  # every call hung up, its peer and session freed
            await runtime.flow.stop()
            await transports.stop()
            if watchdog is not None:
                await watchdog.stop()
            loader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loader
            await runtime.aclose()

    routes: list[BaseRoute] = [
        *health.routes(runtime),
        *http_audio.routes(runtime),
        *http_admin.routes(runtime),
        *http_admin_voices.routes(runtime),  # voices an engine registers (VoiceRegistration)
        *http_admin_models.routes(runtime),  # /admin/models: list, pull, remove
        *http_debug.routes(runtime),
        *http_engines.routes(runtime),  # /admin/engines: hot reload
        *http_memory.routes(runtime),  # /debug/memory, /debug/tracemalloc
        *ws_stream.routes(runtime),
        *realtime_stream.routes(runtime),  # the OpenAI Realtime API over WebSocket
        *realtime_client_secrets.routes(runtime),  # its short-lived single-use keys
        *calls.routes(),  # ... and over WebRTC (server/webrtc/calls.py)
        *web.routes(runtime),  # the browser page: GET / and /web/...
    ]
    middleware = [
        Middleware(RequestId),  # outermost: every answer, refusals too, names its request
        host_middleware(runtime),
        *cors_middleware(runtime),
        *guard_middleware(runtime),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
    app.state.runtime = runtime
    return app


def host_middleware(runtime: Runtime) -> Middleware:
    """Outermost, before CORS and any work: the Host allow-list on HTTP and WebSocket
    alike (DNS rebinding; server/host_guard.py)."""
    errors = runtime.metrics.errors

    def count(transport: str) -> None:
        errors.labels(ErrorCode.HOST_NOT_ALLOWED.value, transport).inc()

    return Middleware(HostGuard, rule=HostRule.from_settings(runtime.settings), count=count)


def cors_middleware(runtime: Runtime) -> list[Middleware]:
    """CORS for the origins in `cors_allowed_origins`; none (closed) by default, so only
    the server's own page (same origin, no CORS needed) can call the API from a browser."""
    origins = runtime.settings.cors_allowed_origins
    if not origins:
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["authorization", "content-type"],
            expose_headers=[REQUEST_ID_HEADER, TRACE_HEADER, "Retry-After", "Location"],
            max_age=600,
        )
    ]


def guard_middleware(runtime: Runtime) -> list[Middleware]:
    """Inside CORS (which answers the preflights of listed origins): the Origin check on
    /v1/* and the body read timeout (server/http/guards.py)."""
    settings = runtime.settings
    stalled = runtime.metrics.errors.labels(ErrorCode.CLIENT_STALLED.value, "http")
    return [
        Middleware(OriginGuard, allowed=settings.cors_allowed_origins),
        Middleware(BodyTimeout, idle_s=settings.limits.http_body_timeout_s, count=stalled.inc),
    ]


def start_watchdog(runtime: Runtime) -> LoopWatchdog | None:
    """The event-loop stall detector (settings.loop_stall_ms; 0 = off), on the running loop."""
    threshold_ms = runtime.settings.loop_stall_ms
    if threshold_ms <= 0:
        return None
    metrics = runtime.metrics
    watchdog = LoopWatchdog(metrics.loop_stalls, metrics.loop_lag, threshold_s=threshold_ms / 1000)
    watchdog.start()
    runtime.watchdog = watchdog
    return watchdog


async def _load(runtime: Runtime) -> None:
    try:
        await runtime.load()
    except EngineConfigError as exc:  # the config is wrong: stop, `serve` exits 2 with it
        log.info("engine configuration error; stopping", extra={"error": str(exc)})
        runtime.stop_for(exc)
    except Exception:
        # runtime.load_error is reported by /readyz; the process stays up to say so.
        log.exception("engines failed to load")

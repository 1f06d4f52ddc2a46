"""GET /debug/stats: the per-stage profiler (mean, P50, P99 over a sliding window) and live
state, behind the admin key like /admin routes (`voxserve stats` prints it as a table).

Debug figures tell an outsider how loaded the server is, so they are not public."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from voxserve.observe.process_memory import process_stats
from voxserve.runtime import Runtime
from voxserve.server.http.admin import check_admin_key
from voxserve.server.session.http_requests import guarded


def routes(runtime: Runtime) -> list[BaseRoute]:
    async def stats(request: Request, trace_id: str) -> Response:
        check_admin_key(runtime, request.headers.get("authorization", ""))
        return JSONResponse(debug_stats(runtime))

    return [Route("/debug/stats", guarded(stats), methods=["GET"])]


def debug_stats(runtime: Runtime) -> dict[str, Any]:
    """The profiler's summary plus the stage queues, sessions and loop stalls right now."""
    body = runtime.metrics.profiler.as_dict()
    body["metrics_enabled"] = runtime.metrics.enabled
    body["sessions_active"] = runtime.active_sessions
    body["queues"] = {
        name: {
            "waiting": stage.waiting,
            "running": stage.running,
            "limit": stage.concurrency,
            "bulk_waiting": stage.bulk_waiting,
            "bulk_running": stage.bulk_held,
            "bulk_limit": stage.bulk_slots,
        }
        for name, stage in list(runtime.stages.items())
    }
    watchdog = runtime.watchdog
    body["loop_stalls"] = watchdog.stalls if watchdog is not None else None
    body["process"] = {**process_stats(), "tasks": len(asyncio.all_tasks())}
    return body

"""Memory and leak-hunting routes, behind the admin key (`voxserve bench soak` reads them).

GET  /debug/memory                 RSS/PSS/USS, threads, fds, tasks, buffer pool, GC
POST /debug/tracemalloc/snapshot   take the baseline snapshot (needs --tracemalloc N)
GET  /debug/tracemalloc?top=N      the N biggest differences since the baseline
"""

from __future__ import annotations

import asyncio
import gc
import os
import tracemalloc
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from voxserve.errors import ErrorCode, VoxError
from voxserve.observe.process_memory import process_stats, smaps_rollup
from voxserve.runtime import Runtime
from voxserve.server.http.admin import check_admin_key
from voxserve.server.session.http_requests import guarded


def memory_body(runtime: Runtime) -> dict[str, Any]:
    try:
        tasks = len(asyncio.all_tasks())
    except RuntimeError:
        tasks = 0
    return {
        "pid": os.getpid(),
        "ready": runtime.ready,  # this worker's /readyz (with workers, any one may answer it)
        **smaps_rollup(),
        **process_stats(),
        "tasks": tasks,
        "sessions_active": runtime.active_sessions,
        "pool": runtime.pool.as_dict(),
        "gc": {
            "counts": list(gc.get_count()),
            "thresholds": list(gc.get_threshold()),
            "frozen": gc.get_freeze_count(),
            "collections": [s["collections"] for s in gc.get_stats()],
        },
        "generations": [g.as_dict() for g in list(runtime.generations)],
        "tracemalloc": tracemalloc.is_tracing(),
    }


class _Snapshots:
    baseline: tracemalloc.Snapshot | None = None


def routes(runtime: Runtime) -> list[BaseRoute]:
    frames = runtime.settings.tracemalloc_frames
    if frames and not tracemalloc.is_tracing():
        tracemalloc.start(frames)
    snapshots = _Snapshots()

    async def memory(request: Request, trace_id: str) -> Response:
        check_admin_key(runtime, request.headers.get("authorization", ""))
        return JSONResponse(memory_body(runtime))

    async def snapshot(request: Request, trace_id: str) -> Response:
        check_admin_key(runtime, request.headers.get("authorization", ""))
        _check_tracing()
        snapshots.baseline = _filtered(tracemalloc.take_snapshot())
        traced, peak = tracemalloc.get_traced_memory()
        return JSONResponse({"baseline": True, "traced_bytes": traced, "peak_bytes": peak})

    async def diff(request: Request, trace_id: str) -> Response:
        check_admin_key(runtime, request.headers.get("authorization", ""))
        _check_tracing()
        if snapshots.baseline is None:
            raise VoxError(ErrorCode.INVALID_PARAMETER, "take a baseline first (POST .../snapshot)")
        try:
            top = max(1, min(int(request.query_params.get("top", "20")), 200))
        except ValueError:
            raise VoxError(ErrorCode.INVALID_PARAMETER, "top must be an integer") from None
        now = _filtered(tracemalloc.take_snapshot())
        stats = now.compare_to(snapshots.baseline, "lineno")[:top]
        return JSONResponse(
            {
                "total_diff_bytes": sum(
                    s.size_diff for s in now.compare_to(snapshots.baseline, "filename")
                ),
                "top": [
                    {
                        "where": str(stat.traceback[0]) if stat.traceback else "?",
                        "size_diff_bytes": stat.size_diff,
                        "size_bytes": stat.size,
                        "count_diff": stat.count_diff,
                    }
                    for stat in stats
                ],
            }
        )

    return [
        Route("/debug/memory", guarded(memory), methods=["GET"]),
        Route("/debug/tracemalloc/snapshot", guarded(snapshot), methods=["POST"]),
        Route("/debug/tracemalloc", guarded(diff), methods=["GET"]),
    ]


def _check_tracing() -> None:
    if not tracemalloc.is_tracing():
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            "tracemalloc is off: start the server with --tracemalloc N (frames)",
        )


def _filtered(snapshot: tracemalloc.Snapshot) -> tracemalloc.Snapshot:
    """Without tracemalloc's own and the import machinery's allocations."""
    return snapshot.filter_traces(
        (
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
        )
    )

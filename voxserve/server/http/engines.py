"""Hot engine reload over HTTP, behind the admin key, and SIGHUP for the same.

    GET  /admin/engines          the live generations (current and retired) and reloads
    POST /admin/engines/reload   {"kinds"?: ["vad", "asr", "tts", "responder"]} (default all)

New sessions start on the new engines as soon as the reload answers; live sessions finish
on the ones they started with, which are closed after their last session (pipeline/generations.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from voxserve.engines.loaded import ENGINE_KINDS
from voxserve.errors import ErrorCode, VoxError
from voxserve.runtime import Runtime
from voxserve.server.http.admin import check_admin_key
from voxserve.server.session.http_requests import guarded, read_json

log = logging.getLogger(__name__)


def routes(runtime: Runtime) -> list[BaseRoute]:
    async def listing(request: Request, trace_id: str) -> Response:
        check_admin_key(runtime, request.headers.get("authorization", ""))
        return JSONResponse(engines_body(runtime))

    async def reload(request: Request, trace_id: str) -> Response:
        check_admin_key(runtime, request.headers.get("authorization", ""))
        declared = request.headers.get("content-length", "0")
        body = (
            await read_json(request, 4096, runtime.settings.limits.max_json_depth)
            if declared not in ("", "0")
            else {}
        )
        kinds = _kinds(body.get("kinds"))
        previous = runtime.generation.number  # not_ready while the first load runs
        generation = await runtime.reload(kinds)
        return JSONResponse(
            {"generation": generation.number, "previous": previous, "kinds": list(kinds)}
            | {"engines": engines_body(runtime)["generations"]}
        )

    return [
        Route("/admin/engines", guarded(listing), methods=["GET"]),
        Route("/admin/engines/reload", guarded(reload), methods=["POST"]),
    ]


def engines_body(runtime: Runtime) -> dict[str, Any]:
    return {
        "current": runtime.generation.number if runtime.ready else None,
        "reloads": runtime.reloads,
        "generations": [generation.as_dict() for generation in list(runtime.generations)],
    }


def _kinds(value: object) -> tuple[str, ...]:
    if value is None:
        return ENGINE_KINDS
    if not isinstance(value, list) or not value or not all(isinstance(k, str) for k in value):
        raise VoxError(ErrorCode.INVALID_PARAMETER, "kinds must be a non-empty list of names")
    return tuple(dict.fromkeys(value))


def install_sighup(runtime: Runtime) -> bool:
    """SIGHUP reloads every engine (on the running loop). Only the main thread can own a
    signal handler; a server run in a thread (tests, embedding) has none."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    async def reload() -> None:
        await runtime.loaded.wait()  # a SIGHUP during start-up reloads once loaded
        with contextlib.suppress(VoxError):  # logged and counted by the runtime
            await runtime.reload()

    def on_sighup() -> None:
        log.info("SIGHUP: reloading the engines")
        task = loop.create_task(reload(), name="voxserve-sighup-reload")
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    try:
        loop.add_signal_handler(signal.SIGHUP, on_sighup)
    except (ValueError, RuntimeError, NotImplementedError, AttributeError):
        return False
    return True

"""Admin HTTP routes for the models on the server's host, behind the admin key
(server/http/admin.py's rules: 403 with no key configured, 401 for a wrong one); what
`voxserve models --url` calls.

    GET    /admin/models          {"models": [...installed...], "pulls": [...]}
    POST   /admin/models/pull     {"names": ["small.en", ...]} -> 202 {"pulls": [...]}
    GET    /admin/models/pull     {"pulls": [...]}: in flight, then the latest outcomes
    DELETE /admin/models/{name}   remove a downloaded model -> {"name", "freed_bytes"}

A name from here is a model name or a repo id (`owner/name`: letters, digits, `._-`, no
`..`, at most 200 characters); never a path, so a client cannot make the server read,
list or delete a directory it names. Pulls are bounded (server/http/model_pulls.py): one per
name at a time, two downloading, sixteen queued; a request past that is refused whole.
Listing and resolving read the disk (and a Piper name the voices catalogue): they run on
the files pool, never on the event loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from voxserve.engines import model_store
from voxserve.errors import ErrorCode, VoxError
from voxserve.runtime import Runtime
from voxserve.server.http.admin import admin_only
from voxserve.server.http.model_pulls import Job, PullBoard, PullsFull, child_pull
from voxserve.server.session.http_requests import Endpoint, read_json

if TYPE_CHECKING:
    from voxserve.engines.model_catalog import ModelRef

PULL_BODY_BYTES = 16 * 1024  # 16 names of at most 200 characters, with room to spare
MAX_NAMES = 16
RETRY_AFTER_S = 30


def routes(runtime: Runtime) -> list[BaseRoute]:
    board = PullBoard()

    def authorised(handler: Callable[[Request], Awaitable[Response]]) -> Endpoint:
        return admin_only(runtime, handler)

    async def listing(request: Request) -> Response:
        models = await runtime.pools.files.run(model_store.installed)
        return JSONResponse({"models": [m.as_dict() for m in models], "pulls": board.states()})

    async def pulls(request: Request) -> Response:
        return JSONResponse({"pulls": board.states()})

    async def pull(request: Request) -> Response:
        body = await read_json(request, PULL_BODY_BYTES, runtime.settings.limits.max_json_depth)
        names = _names(body.get("names"))
        refs = await runtime.pools.files.run(_resolve_all, names)
        offline = _offline(runtime)
        jobs = [(ref.name, _job(ref, offline)) for ref in refs]
        try:
            states = board.submit(jobs)
        except PullsFull as exc:
            raise VoxError(ErrorCode.OVERLOADED, str(exc), retry_after_s=RETRY_AFTER_S) from None
        return JSONResponse({"pulls": [s.as_dict() for s in states]}, status_code=202)

    async def delete(request: Request) -> Response:
        name = _name(request.path_params["name"])
        ref = await runtime.pools.files.run(_resolve, name)
        if board.pulling(ref.name):
            raise VoxError(
                ErrorCode.MODEL_NOT_REMOVABLE, f"{ref.name} is being pulled; remove it after"
            )
        freed = await runtime.pools.files.run(_remove, ref)
        return JSONResponse({"name": ref.name, "freed_bytes": freed})

    return [
        Route("/admin/models", authorised(listing), methods=["GET"]),
        Route("/admin/models/pull", authorised(pulls), methods=["GET"]),
        Route("/admin/models/pull", authorised(pull), methods=["POST"]),
        Route("/admin/models/{name:path}", authorised(delete), methods=["DELETE"]),
    ]


def _names(value: object) -> list[str]:
    """The request's names, each checked before any is resolved: one bad name refuses
    the whole request."""
    if not isinstance(value, list) or not value:
        raise VoxError(ErrorCode.INVALID_PARAMETER, "names must be a non-empty list of names")
    if len(value) > MAX_NAMES:
        raise VoxError(ErrorCode.INVALID_PARAMETER, f"at most {MAX_NAMES} names a request")
    return list(dict.fromkeys(_name(name) for name in value))


def _name(value: object) -> str:
    try:
        return model_store.check_name(value, allow_local=False)
    except model_store.BadModelName as exc:
        raise VoxError(ErrorCode.INVALID_PARAMETER, str(exc)) from None


def _resolve(name: str) -> ModelRef:
    try:
        return model_store.resolve(name, allow_local=False)
    except model_store.BadModelName as exc:
        raise VoxError(ErrorCode.INVALID_PARAMETER, str(exc)) from None
    except model_store.UnknownModel as exc:
        raise VoxError(ErrorCode.MODEL_NOT_FOUND, str(exc)) from None


def _resolve_all(names: list[str]) -> list[ModelRef]:
    return [_resolve(name) for name in names]


def _remove(ref: ModelRef) -> int:
    try:
        return model_store.remove(ref)
    except model_store.NotRemovable as exc:
        raise VoxError(ErrorCode.MODEL_NOT_REMOVABLE, str(exc)) from None
    except model_store.UnknownModel as exc:
        raise VoxError(ErrorCode.MODEL_NOT_FOUND, str(exc)) from None


def _offline(runtime: Runtime) -> bool:
    from voxserve.engines import hub

    return hub.hub_offline(runtime.settings.offline)


def _job(ref: ModelRef, offline: bool) -> Job | None:
    """The pull of `ref`, a child process (None: packaged or local, nothing to fetch)."""
    if ref.repo_id is None:
        return None
    return child_pull(ref.name, ref.repo_id, offline=offline)

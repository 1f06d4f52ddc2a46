"""Liveness, readiness and metrics: /healthz answers while models load, /readyz only once
loaded (and 503 again while draining for shutdown; while loading, `loading` lists the model
downloads in flight with their bytes), /metrics in the Prometheus format."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from voxserve.engines.hub_progress import PROGRESS
from voxserve.runtime import Runtime


def routes(runtime: Runtime) -> list[Route]:
    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "alive"})

    async def readyz(request: Request) -> JSONResponse:
        if runtime.drain.draining:  # load balancers stop sending; live sessions finish
            return JSONResponse(
                {"status": "draining", "sessions": runtime.drain.live}, status_code=503
            )
        if runtime.ready:
            return JSONResponse({"status": "ready", "load_seconds": runtime.engines.load_seconds})
        body: dict[str, object] = {"status": "loading"}
        fetching = PROGRESS.snapshot()  # models downloading on first use (engines/hub.py)
        if fetching:
            body["loading"] = [item.as_json() for item in fetching]
        if runtime.load_error:
            body = {"status": "failed", "error": runtime.load_error}
        return JSONResponse(body, status_code=503)

    async def metrics(request: Request) -> Response:
        body = generate_latest(runtime.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return [Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics)]

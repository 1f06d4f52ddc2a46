"""The browser page: GET / serves voxserve/web/index.html, GET /web/<file> its assets, and
GET /web/options.json the modes, voices and languages the page offers.

Plain files shipped as package data (no build step, nothing fetched from elsewhere). Only the
files in that folder are served: the name is looked up in a fixed listing, never joined to a
path a client chose.
"""

from __future__ import annotations

from dataclasses import asdict
from importlib import resources

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from voxserve.runtime import Runtime

MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}


def _assets() -> dict[str, bytes]:
    """Every servable file of voxserve/web, read once at start-up (a few tens of KB)."""
    folder = resources.files("voxserve") / "web"
    files: dict[str, bytes] = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
        if entry.is_file() and suffix in MEDIA_TYPES:
            files[entry.name] = entry.read_bytes()
    return files


def _response(name: str, body: bytes) -> Response:
    suffix = "." + name.rsplit(".", 1)[-1]
    # no-cache: the browser revalidates, so a new server version is never mixed with old JS.
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    return Response(body, media_type=MEDIA_TYPES[suffix], headers=headers)


def routes(runtime: Runtime) -> list[BaseRoute]:
    """GET /, GET /web/{name} and GET /web/options.json (what the page offers to choose)."""
    assets = _assets()

    async def options(request: Request) -> Response:
        # Modes, voices and ASR languages as the loaded engines report them; 503 until then,
        # and the page retries.
        if not runtime.ready:
            body = {"error": {"code": "not_ready", "message": "models are still loading"}}
            return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        engines = runtime.engines
        return JSONResponse(
            {
                "modes": ["assistant", "asr", "tts"],
                "voices": [asdict(v) for v in engines.voices()],
                "default_voice": engines.default_voice,
                "languages": list(engines.asr.languages),
            }
        )

    async def index(request: Request) -> Response:
        return _response("index.html", assets["index.html"])

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        body = assets.get(name)
        if body is None:
            return Response("not found", status_code=404, media_type="text/plain")
        return _response(name, body)

    return [
        Route("/", index, methods=["GET", "HEAD"]),
        Route("/web/options.json", options, methods=["GET"]),
        Route("/web/{name}", asset, methods=["GET", "HEAD"]),
    ]

"""Admin HTTP routes for the TTS cache, behind `Authorization: Bearer <admin_key>`.

    GET    /admin/cache              stats (and prewarm progress, TTS health)
    POST   /admin/cache/invalidate   {"voice"?, "text_prefix"?, "all"?}
    POST   /admin/cache/prewarm      {"sentences": [...], "voice"?, "speed"?, "sample_rate"?}
    DELETE /admin/cache              drop every entry

With no admin key configured every route answers 403 (`admin_disabled`), saying how to set
one; a missing or wrong key is 401 (`unauthorized`). Prewarm takes sentences, never a
server-side path: a client names no file on the server.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from voxserve.audio.resample import check_rate
from voxserve.cache.prewarm import PrewarmItem, expand
from voxserve.cache.tts_cache import TtsCache
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.synthesis.request import check_speed, check_text
from voxserve.runtime import Runtime
from voxserve.server.session.http_requests import Endpoint, guarded, read_json
from voxserve.server.session.json_input import as_float
from voxserve.types import SUPPORTED_OUTPUT_RATES

ADMIN_BODY_BYTES = 4 * 1024 * 1024  # a prewarm list: thousands of sentences in one request


def routes(runtime: Runtime) -> list[BaseRoute]:
    def authorised(handler: Callable[[Request], Awaitable[Response]]) -> Endpoint:
        return admin_only(runtime, handler)

    async def stats(request: Request) -> Response:
        return JSONResponse(stats_body(runtime))

    async def invalidate(request: Request) -> Response:
        cache = _cache(runtime)
        body = await read_json(request, ADMIN_BODY_BYTES, runtime.settings.limits.max_json_depth)
        voice = _optional_str(body, "voice")
        prefix = _optional_str(body, "text_prefix")
        everything = body.get("all", False)
        if not isinstance(everything, bool):
            raise VoxError(ErrorCode.INVALID_PARAMETER, "all must be true or false")
        if not everything and voice is None and not prefix:
            raise VoxError(
                ErrorCode.INVALID_PARAMETER,
                'say what to invalidate: "voice", "text_prefix" (both: both match) or "all": true',
            )
        if voice is not None and runtime.ready:
            voice = runtime.engines.voice(voice)[0].id  # aliases name the same entries
        count = cache.invalidate(voice=voice, text_prefix=prefix, everything=everything)
        return JSONResponse({"invalidated": count})

    async def clear(request: Request) -> Response:
        return JSONResponse({"cleared": _cache(runtime).clear()})

    async def prewarm(request: Request) -> Response:
        cache = _cache(runtime)
        prewarmer = runtime.prewarmer
        assert prewarmer is not None  # made with the cache
        body = await read_json(request, ADMIN_BODY_BYTES, runtime.settings.limits.max_json_depth)
        items = _prewarm_items(runtime, body)
        try:
            total = prewarmer.submit(items)
        except ValueError as exc:
            raise VoxError(ErrorCode.INVALID_PARAMETER, str(exc)) from None
        return JSONResponse(
            {"accepted": len(items), "total": total, "done": cache.prewarm_done}, status_code=202
        )

    return [
        Route("/admin/cache", authorised(stats), methods=["GET"]),
        Route("/admin/cache", authorised(clear), methods=["DELETE"]),
        Route("/admin/cache/invalidate", authorised(invalidate), methods=["POST"]),
        Route("/admin/cache/prewarm", authorised(prewarm), methods=["POST"]),
    ]


def admin_only(runtime: Runtime, handler: Callable[[Request], Awaitable[Response]]) -> Endpoint:
    """`handler` behind the admin key (check_admin_key), with the routes' error handling."""

    async def checked(request: Request, trace_id: str) -> Response:
        check_admin_key(runtime, request.headers.get("authorization", ""))
        return await handler(request)

    return guarded(checked)


def check_admin_key(runtime: Runtime, authorization: str) -> None:
    """403 when no key is configured, 401 unless the bearer token is the key (compared in
    constant time)."""
    key = runtime.settings.admin_key
    if key is None or not key.get_secret_value():
        raise VoxError(
            ErrorCode.ADMIN_DISABLED,
            "admin routes are disabled: set an admin key with the VOXSERVE_ADMIN_KEY "
            "environment variable (or admin_key in the config file) and restart",
        )
    scheme, _, token = authorization.partition(" ")
    expected = key.get_secret_value().encode("utf-8")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        token.strip().encode("utf-8"), expected
    ):
        raise VoxError(ErrorCode.UNAUTHORIZED, "missing or wrong admin key (Authorization: Bearer)")


def stats_body(runtime: Runtime) -> dict[str, Any]:
    stage = runtime.stages.get("tts")
    reason = runtime.tts_health.reason(stage.live_waiting if stage else 0)
    health = {
        "degraded": reason is not None,
        "reason": reason,
        "fallbacks": runtime.tts_health.fallbacks,
        "refused": runtime.tts_health.refused,
    }
    if runtime.cache is None:
        return {"enabled": False, "tts": health}
    pending = runtime.prewarmer.pending if runtime.prewarmer else 0
    stats = runtime.cache.stats().as_dict()
    return {"enabled": True, **stats, "prewarm_pending": pending, "tts": health}


def _cache(runtime: Runtime) -> TtsCache:
    if runtime.cache is None:
        raise VoxError(
            ErrorCode.INVALID_PARAMETER, "the TTS cache is disabled (cache.enabled = false)"
        )
    return runtime.cache


def _optional_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None or isinstance(value, str):
        return value
    raise VoxError(ErrorCode.INVALID_PARAMETER, f"{name} must be a string")


def _prewarm_items(runtime: Runtime, body: dict[str, Any]) -> list[PrewarmItem]:
    """Validated in full before anything is queued: a bad request queues nothing."""
    sentences = body.get("sentences")
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise VoxError(ErrorCode.INVALID_PARAMETER, "sentences must be a list of strings")
    engines = runtime.engines  # not_ready until loaded
    voice = engines.voice(_optional_str(body, "voice"))[0].id
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float):
        raise VoxError(ErrorCode.INVALID_PARAMETER, "speed must be a number")
    speed = check_speed(as_float(speed, "speed"))
    rate = body.get("sample_rate", runtime.settings.tts.output_sample_rate)
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise VoxError(ErrorCode.INVALID_PARAMETER, "sample_rate must be an integer (Hz)")
    check_rate(rate, SUPPORTED_OUTPUT_RATES)
    max_chars = runtime.settings.limits.max_text_chars
    texts = [check_text(text, max_chars) for text in expand(sentences)]
    return [PrewarmItem(text, voice, speed, rate) for text in texts]

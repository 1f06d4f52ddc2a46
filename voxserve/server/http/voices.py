"""GET /v1/voices: the voices installed, and apart from them the Piper voices that could be.

`voices` keeps its shape (each `Voice` with `openai_aliases`: the OpenAI names that speak it;
a Piper voice's description says its language, quality and licence).
`downloadable` lists the Piper voices catalogue's voices not installed (`id`, `language`,
`quality`, ...; engines/piper_voices.py) from the cached catalogue, so a plain listing never
touches the network; `?downloadable=true` fetches or refreshes the catalogue first when the
server is online (at most every REFRESH_S), `?downloadable=false` leaves it out, and
`?language=en` (or `en_GB`) keeps one language. `catalogue` says where the list came from:
"cached", or "unavailable" (never fetched, offline, or the hub failed).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from voxserve.engines import piper_voices
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.runtime import Runtime
from voxserve.server.session.openai_voices import openai_aliases, voice_names

_FLAGS = {"true": True, "1": True, "false": False, "0": False}
MAX_LANGUAGE_CHARS = 16


async def voices(runtime: Runtime, request: Request) -> Response:
    engines, table = runtime.engines, runtime.settings.tts.openai_voices
    fetch = _flag(request.query_params.get("downloadable"))
    language = request.query_params.get("language") or None
    if language is not None and len(language) > MAX_LANGUAGE_CHARS:
        raise VoxError(ErrorCode.INVALID_PARAMETER, f"language {quoted(language)} is too long")
    installed = engines.voices()
    aliases = openai_aliases(installed, engines.default_voice, table)
    body: dict[str, Any] = {
        "voices": [asdict(v) | {"openai_aliases": aliases[v.id]} for v in installed],
        "default": engines.default_voice,
    }
    if fetch is not False:
        # Reading (or fetching) the catalogue is disk or network work: not on the loop.
        book = await asyncio.to_thread(piper_voices.listing_catalogue, fetch=bool(fetch))
        names = set(voice_names(installed))
        body["downloadable"] = (
            [] if book is None else piper_voices.downloadable(book, names, language)
        )
        body["catalogue"] = "unavailable" if book is None else "cached"
    return JSONResponse(body)


def _flag(value: str | None) -> bool | None:
    if value is None:
        return None
    flag = _FLAGS.get(value.strip().lower())
    if flag is None:
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            f"downloadable must be true or false, got {quoted(value)}",
        )
    return flag

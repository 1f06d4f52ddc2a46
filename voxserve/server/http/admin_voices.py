"""Admin HTTP routes for the cosyvoice engine's zero-shot voices, behind the admin key
(server/http/admin.py's rules: 403 with no key configured, 401 for a wrong one).

    GET    /admin/voices/cosyvoice          the registered prompt voices
    POST   /admin/voices/cosyvoice          multipart form: voice, prompt_wav (an audio
                                            file, 1 to 30 s), prompt_text?, language?,
                                            description?  -> 201 {"voice": {...}}
    DELETE /admin/voices/cosyvoice/{voice}  forget it (its files too)

A voice with `prompt_text` makes CosyVoice zero-shot requests, one without it cross-lingual
ones. The prompt is decoded and kept as 16 kHz mono (what CosyVoice reads) in the engine's
`voice_dir`, so it survives a restart (engines/cosyvoice_voices.py). Registering or deleting
a voice drops its cached speech, so a voice re-registered under the same id never plays the
old prompt's audio. With several cosyvoice engines configured, the first one takes them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from voxserve.audio.decode import decode_audio
from voxserve.engines.cosyvoice_request import PROMPT_RATE
from voxserve.engines.cosyvoice_tts import CosyVoiceTts
from voxserve.engines.cosyvoice_voices import DEFAULT_LANGUAGE, MAX_PROMPT_S, MIN_PROMPT_S
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.runtime import Runtime
from voxserve.server.http.admin import admin_only
from voxserve.server.session.http_requests import Endpoint, read_form, read_upload

PROMPT_BODY_BYTES = 16 * 1024 * 1024  # 30 s of WAV at 48 kHz stereo is 11 MB
MAX_TEXT_CHARS = 1000


def routes(runtime: Runtime) -> list[BaseRoute]:
    def authorised(handler: Callable[[Request], Awaitable[Response]]) -> Endpoint:
        return admin_only(runtime, handler)

    async def listing(request: Request) -> Response:
        engine = _engine(runtime)
        prompted = [v for v in engine.voices() if engine.is_prompt_voice(v.id)]
        return JSONResponse({"voices": [asdict(v) for v in prompted]})

    async def register(request: Request) -> Response:
        engine = _engine(runtime)
        form = await read_form(request, PROMPT_BODY_BYTES)
        voice_id = _text(form, "voice", required=True)
        taken = _served_elsewhere(runtime, engine, voice_id)
        if taken is not None:
            raise VoxError(
                ErrorCode.INVALID_PARAMETER,
                f"voice id {quoted(voice_id)} is served by the {taken} engine; pick another",
            )
        data = await read_upload(
            form, "prompt_wav", PROMPT_BODY_BYTES, what="the prompt recording, an audio file"
        )
        pcm = await runtime.pools.decode.run(
            decode_audio, data, max_seconds=MAX_PROMPT_S, rate=PROMPT_RATE
        )
        if pcm.size < MIN_PROMPT_S * PROMPT_RATE:
            raise VoxError(
                ErrorCode.INVALID_AUDIO,
                f"the prompt recording is {pcm.size / PROMPT_RATE:.2f} s; a voice prompt needs "
                f"at least {MIN_PROMPT_S:g} s of speech (a few seconds work best)",
            )
        prompt_text = _text(form, "prompt_text")
        language = _text(form, "language") or DEFAULT_LANGUAGE
        description = _text(form, "description")
        try:
            voice = await runtime.pools.files.run(  # writes the prompt's files
                engine.add_prompt_voice, voice_id, pcm, prompt_text, language, description
            )
        except ValueError as exc:
            raise VoxError(ErrorCode.INVALID_PARAMETER, str(exc)) from None
        _changed(runtime, voice_id)
        return JSONResponse({"voice": asdict(voice)}, status_code=201)

    async def delete(request: Request) -> Response:
        engine = _engine(runtime)
        voice_id = request.path_params["voice"]
        removed = await runtime.pools.files.run(engine.remove_prompt_voice, voice_id)
        if not removed:
            raise VoxError(
                ErrorCode.UNKNOWN_VOICE, f"no registered cosyvoice voice {quoted(voice_id)}"
            )
        _changed(runtime, voice_id)
        return JSONResponse({"deleted": voice_id})

    return [
        Route("/admin/voices/cosyvoice", authorised(listing), methods=["GET"]),
        Route("/admin/voices/cosyvoice", authorised(register), methods=["POST"]),
        Route("/admin/voices/cosyvoice/{voice}", authorised(delete), methods=["DELETE"]),
    ]


def _engine(runtime: Runtime) -> CosyVoiceTts:
    for engine in runtime.engines.tts:  # not_ready until the engines are loaded
        if isinstance(engine, CosyVoiceTts):
            return engine
    raise VoxError(
        ErrorCode.INVALID_PARAMETER,
        "no cosyvoice engine is configured (engines.tts); docs/cosyvoice.md says how",
    )


def _served_elsewhere(runtime: Runtime, engine: CosyVoiceTts, voice_id: str) -> str | None:
    for other in runtime.engines.tts:
        if other is not engine and any(voice_id in (v.id, *v.aliases) for v in other.voices()):
            return other.info.name
    return None


def _changed(runtime: Runtime, voice_id: str) -> None:
    runtime.engines.refresh_voices()
    if runtime.cache is not None:
        runtime.cache.invalidate(voice=voice_id)


def _text(form: FormData, name: str, *, required: bool = False) -> str:
    value = form.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise VoxError(ErrorCode.INVALID_PARAMETER, f"form field {name!r} (text) is required")
    if len(value) > MAX_TEXT_CHARS:
        raise VoxError(
            ErrorCode.TEXT_TOO_LONG, f"form field {name!r} is over {MAX_TEXT_CHARS} characters"
        )
    return value.strip()

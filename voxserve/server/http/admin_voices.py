"""Admin HTTP routes for the voices a TTS engine registers from a recorded prompt (the
`VoiceRegistration` capability, engines/base.py: today the cosyvoice engine's zero-shot
voices), behind the admin key (server/http/admin.py's rules: 403 with no key configured,
401 for a wrong one). `{engine}` is a configured TTS engine's name; these routes know no
engine by name, only the capability.

    GET    /admin/voices/{engine}          the registered voices
    POST   /admin/voices/{engine}          multipart form: voice, prompt_wav (an audio file,
                                           as long as the engine's `prompt_rules` allow),
                                           prompt_text?, language?, description?
                                           -> 201 {"voice": {...}}
    DELETE /admin/voices/{engine}/{voice}  forget it (its files too)

An engine name not configured, or an engine without the capability: `invalid_parameter`.
The prompt is decoded to mono at the engine's prompt rate and handed to the engine, which
keeps it (so it survives a restart). Registering or deleting a voice drops its cached
speech, so a voice re-registered under the same id never plays the old prompt's audio.
With several engines of that name configured, the first one takes them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from voxserve.audio.decode import decode_audio
from voxserve.engines.base import VoiceRegistration
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
        engine = _engine(runtime, request)
        return JSONResponse({"voices": [asdict(v) for v in engine.registered_voices()]})

    async def register(request: Request) -> Response:
        engine = _engine(runtime, request)
        rules = engine.prompt_rules
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
            decode_audio, data, max_seconds=rules.max_s, rate=rules.rate
        )
        if pcm.size < rules.min_s * rules.rate:
            raise VoxError(
                ErrorCode.INVALID_AUDIO,
                f"the prompt recording is {pcm.size / rules.rate:.2f} s; a voice prompt needs "
                f"at least {rules.min_s:g} s of speech (a few seconds work best)",
            )
        prompt_text = _text(form, "prompt_text")
        language = _text(form, "language") or rules.default_language
        description = _text(form, "description")
        try:
            voice = await runtime.pools.files.run(  # writes the prompt's files
                engine.register_voice, voice_id, pcm, prompt_text, language, description
            )
        except ValueError as exc:
            raise VoxError(ErrorCode.INVALID_PARAMETER, str(exc)) from None
        _changed(runtime, voice_id)
        return JSONResponse({"voice": asdict(voice)}, status_code=201)

    async def delete(request: Request) -> Response:
        engine = _engine(runtime, request)
        voice_id = request.path_params["voice"]
        removed = await runtime.pools.files.run(engine.unregister_voice, voice_id)
        if not removed:
            name = request.path_params["engine"]
            raise VoxError(
                ErrorCode.UNKNOWN_VOICE, f"no voice {quoted(voice_id)} registered with {name}"
            )
        _changed(runtime, voice_id)
        return JSONResponse({"deleted": voice_id})

    return [
        Route("/admin/voices/{engine}", authorised(listing), methods=["GET"]),
        Route("/admin/voices/{engine}", authorised(register), methods=["POST"]),
        Route("/admin/voices/{engine}/{voice}", authorised(delete), methods=["DELETE"]),
    ]


def _engine(runtime: Runtime, request: Request) -> VoiceRegistration:
    """The first configured TTS engine named as the path says, if it registers voices."""
    name = request.path_params["engine"]
    engines = runtime.engines.tts  # not_ready until the engines are loaded
    engine = next((e for e in engines if e.info.name == name), None)
    if engine is None:
        configured = ", ".join(sorted({e.info.name for e in engines}))
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            f"no TTS engine {quoted(name)} is configured (engines.tts: {configured})",
        )
    if not isinstance(engine, VoiceRegistration):
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            f"the {name} engine does not register voices; docs/engines.md lists those that do",
        )
    return engine


def _served_elsewhere(runtime: Runtime, engine: object, voice_id: str) -> str | None:
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

"""OpenAI-compatible HTTP audio: speech, transcriptions, translations, voices and models
under /v1.

The shapes follow OpenAI's audio API closely enough that the official `openai` SDK works
unchanged against ``base_url=http://host:port/v1``. Every request is validated in full before
any byte of a response is sent, so a client mistake is always a 4xx JSON error
(`voxserve.server.session.errors.error_response`) and never a truncated stream.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from voxserve.runtime import Runtime
from voxserve.server.http import speech as http_speech
from voxserve.server.http import transcriptions as http_transcriptions
from voxserve.server.http import voices as http_voices
from voxserve.server.session.admission import admit_request
from voxserve.server.session.auth import KeyRing, bearer_token
from voxserve.server.session.http_requests import Handler, guarded
from voxserve.server.session.openai_models import models_response
from voxserve.server.session.quotas import quotas_of


def routes(runtime: Runtime) -> list[BaseRoute]:
    """The /v1 HTTP routes; each answers 401 `unauthorized` without a valid API key (when
    keys are configured), 429 `quota_exceeded` over the key's request rate, and 503
    `not_ready` until the engines are loaded. The key id is `request.state.principal`."""
    keys = KeyRing.from_settings(runtime.settings)
    quotas = quotas_of(runtime)

    def authed(handler: Handler) -> Handler:
        async def checked(request: Request, trace_id: str) -> Response:
            principal = keys.authenticate(bearer_token(request.headers.get("authorization")))
            quotas.request(principal)
            request.state.principal = principal
            return await handler(request, trace_id)

        return checked

    async def speech(request: Request, trace_id: str) -> Response:
        admit_request(runtime)  # 503 + Retry-After while draining or overloaded
        return await http_speech.speech(runtime, request, trace_id)

    async def transcriptions(request: Request, trace_id: str) -> Response:
        admit_request(runtime)
        return await http_transcriptions.transcriptions(runtime, request)

    async def translations(request: Request, trace_id: str) -> Response:
        admit_request(runtime)
        return await http_transcriptions.translations(runtime, request)

    async def voices(request: Request, trace_id: str) -> Response:
        return await http_voices.voices(runtime, request)

    async def models(request: Request, trace_id: str) -> Response:
        return models_response(runtime)  # openai_models.py

    return [
        Route("/v1/audio/speech", guarded(authed(speech)), methods=["POST"]),
        Route("/v1/audio/transcriptions", guarded(authed(transcriptions)), methods=["POST"]),
        Route("/v1/audio/translations", guarded(authed(translations)), methods=["POST"]),
        Route("/v1/voices", guarded(authed(voices)), methods=["GET"]),
        Route("/v1/models", guarded(authed(models)), methods=["GET"]),
    ]

"""POST /v1/realtime/client_secrets: OpenAI's request and answer, so the official SDK's
`client.realtime.client_secrets.create(expires_after=..., session=...)` works unchanged.

Body (JSON, every field optional): `expires_after {anchor: "created_at", seconds: 10..7200}`
(default settings.realtime.client_secret_ttl_s) and `session`, a Realtime session object
(GA names: `type` "realtime" or "transcription"; beta names accepted as session.update
takes them). The session is checked in full now (an unknown voice is a 400 here, not a
failed connection later) and answered as session.created will describe it. Answer:
`{"value": "ek_...", "expires_at": <epoch s>, "session": {...}}`. Only an API key mints
(with auth off, anyone); a client secret may not mint another. The store and its rules
(single use, expiry, bounds per key and server-wide, the stored session's size cap
(`session_too_large`), shared by workers, `storage_unavailable`) are
server/realtime_api/secrets.py's.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.runtime import Runtime
from voxserve.server.realtime_api.secrets import (
    MAX_TTL_S,
    MIN_TTL_S,
    apply_session,
    is_client_secret,
    secrets_of,
    session_kind,
)
from voxserve.server.realtime_api.session import describe, initial_wire, installed_of
from voxserve.server.session import fields as f
from voxserve.server.session.admission import admit_request
from voxserve.server.session.auth import KeyRing, bearer_token
from voxserve.server.session.http_requests import guarded, read_json
from voxserve.server.session.quotas import quotas_of

BODY_KEYS = ("expires_after", "session")


def routes(runtime: Runtime) -> list[BaseRoute]:
    keys = KeyRing.from_settings(runtime.settings)
    quotas = quotas_of(runtime)

    async def create(request: Request, trace_id: str) -> Response:
        token = bearer_token(request.headers.get("authorization"))
        principal = minting_principal(keys, token)
        quotas.request(principal)
        limits = runtime.settings.limits
        body = await read_json(request, limits.max_message_bytes, limits.max_json_depth)
        ttl_s = expires_after(body, runtime.settings.realtime.client_secret_ttl_s)
        session = f.obj(body, "session", "")
        admit_request(runtime)  # the voices are the loaded engines'
        effective = effective_session(runtime, session)
        minted = secrets_of(runtime).mint(principal, session, ttl_s)
        effective["expires_at"] = minted.expires_at
        answer = {"value": minted.value, "expires_at": minted.expires_at, "session": effective}
        return JSONResponse(answer, headers={"Cache-Control": "no-store"})

    return [Route("/v1/realtime/client_secrets", guarded(create), methods=["POST"])]


def minting_principal(keys: KeyRing, token: str | None) -> str:
    """The key id that mints: an API key (anyone with auth off), never a client secret
    (a page holding one could otherwise keep itself in keys forever)."""
    if is_client_secret(token, keys):
        raise VoxError(
            ErrorCode.UNAUTHORIZED,
            "a client secret cannot mint another: POST /v1/realtime/client_secrets needs an "
            "API key",
            fatal=True,
        )
    return keys.authenticate(token)


def expires_after(body: dict[str, Any], default_s: int) -> int:
    """The lifetime the body asks for (OpenAI's `expires_after`), in seconds."""
    for key in body:
        if key not in BODY_KEYS:
            raise f.bad_value(quoted(key), "is not a parameter: expires_after, session")
    spec = f.obj(body, "expires_after", "")
    if spec is None:
        return default_s
    for key in spec:
        if key not in ("anchor", "seconds"):
            raise f.bad_value(f"expires_after: {quoted(key)}", "is not a parameter voxserve knows")
    f.choice(spec, "anchor", "expires_after", ("created_at",))
    seconds = spec.get("seconds")
    if seconds is None:
        return default_s
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        raise f.invalid("expires_after.seconds must be an integer")
    if not MIN_TTL_S <= seconds <= MAX_TTL_S:
        raise f.bad_value("expires_after.seconds", f"must be {MIN_TTL_S}..{MAX_TTL_S}")
    return seconds


def effective_session(runtime: Runtime, session: dict[str, Any] | None) -> dict[str, Any]:
    """The session object a connection with this secret will start with (session.created's
    `session`, before it has an id), checked as /v1/realtime will apply it."""
    installed = installed_of(
        runtime.engines, runtime.settings.vad, runtime.settings.tts.openai_voices
    )
    kind = session_kind(session, "realtime")
    model = (session or {}).get("model")
    wire = initial_wire(installed, model=model if isinstance(model, str) else "", kind=kind)
    if session is not None:
        apply_session(wire, session)
    return describe(wire)

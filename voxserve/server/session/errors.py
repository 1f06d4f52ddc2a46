"""VoxError to HTTP: one JSON shape (OpenAI-style) and a status per error code."""

from __future__ import annotations

from starlette.responses import JSONResponse

from voxserve.errors import ErrorCode, VoxError

_STATUS = {
    ErrorCode.STAGE_TIMEOUT: 504,
    ErrorCode.ENGINE_ERROR: 502,
    ErrorCode.ENGINE_UNAVAILABLE: 503,
    ErrorCode.OVERLOADED: 503,
    ErrorCode.QUOTA_EXCEEDED: 429,
    ErrorCode.TTS_DEGRADED: 503,
    ErrorCode.NOT_READY: 503,
    ErrorCode.MODEL_UNAVAILABLE: 503,
    ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.CLIENT_STALLED: 408,
    ErrorCode.RESUME_FAILED: 404,
    ErrorCode.CALL_NOT_FOUND: 404,
    ErrorCode.WEBRTC_UNAVAILABLE: 501,
    ErrorCode.STORAGE_UNAVAILABLE: 503,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.ADMIN_DISABLED: 403,
    ErrorCode.ORIGIN_NOT_ALLOWED: 403,
    ErrorCode.HOST_NOT_ALLOWED: 403,
    ErrorCode.INTERNAL: 500,
    ErrorCode.MESSAGE_TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.MODEL_NOT_FOUND: 404,
    ErrorCode.MODEL_NOT_REMOVABLE: 409,
}


def http_status(code: ErrorCode) -> int:
    return _STATUS.get(code, 400)


def error_body(error: VoxError) -> dict[str, dict[str, str | None]]:
    """OpenAI's error shape, so its SDK raises a readable exception (also as an SSE event)."""
    body: dict[str, dict[str, str | None]] = {
        "error": {
            "message": error.message,
            "type": "invalid_request_error" if http_status(error.code) < 500 else "server_error",
            "code": error.code.value,
            "param": None,
        }
    }
    if error.stage:
        body["error"]["stage"] = error.stage
    return body


def error_response(error: VoxError) -> JSONResponse:
    """The body follows OpenAI's error shape, so its SDK raises a readable exception."""
    body = error_body(error)
    headers: dict[str, str] = {}
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(error.retry_after_s)
    elif error.code in (ErrorCode.OVERLOADED, ErrorCode.NOT_READY):
        headers["Retry-After"] = "1"
    if error.code is ErrorCode.UNAUTHORIZED:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(body, status_code=http_status(error.code), headers=headers or None)

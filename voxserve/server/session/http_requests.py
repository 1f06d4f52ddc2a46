"""What every /v1 audio route shares: the trace id header and the OpenAI error body for any
failure (`guarded`), request bodies read under a byte cap (JSON or multipart form), and the
check that a named value (a model) is one the route accepts."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Message, Receive

from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.server.session.errors import error_response
from voxserve.server.session.json_input import DEFAULT_MAX_DEPTH, decode_json
from voxserve.server.session.request_id import TRACE_HEADER as TRACE_HEADER
from voxserve.server.session.request_id import trace_id_of

log = logging.getLogger("voxserve.server.http.audio")
"""One logger for all the /v1 audio routes (the name they had as one module)."""

MAX_FORM_FIELDS = 32
JSON_MEDIA_TYPE = "application/json"

Handler = Callable[[Request, str], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


def guarded(handler: Handler) -> Endpoint:
    """Turn every VoxError into the OpenAI error body, and anything else into a logged 500
    whose trace id the client can quote (the log line carries no request content)."""

    async def endpoint(request: Request) -> Response:
        trace_id = trace_id_of(request.scope)  # the one x-request-id carries (request_id.py)
        try:
            response = await handler(request, trace_id)
        except VoxError as exc:
            response = error_response(exc)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is listening any more
        except Exception as exc:
            log.error(
                "http audio request failed",
                extra={"trace_id": trace_id, "path": request.url.path, "error": type(exc).__name__},
            )
            response = error_response(
                VoxError(ErrorCode.INTERNAL, f"internal error; trace id {trace_id}")
            )
        response.headers[TRACE_HEADER] = trace_id
        return response

    return endpoint


def _capped(receive: Receive, limit: int) -> Receive:
    """Count request body bytes as they arrive and stop at `limit`, so an oversized body is
    refused after reading at most `limit` bytes instead of being buffered whole."""
    received = 0

    async def capped_receive() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise _too_large(limit)
        return message

    return capped_receive


def _too_large(limit: int) -> VoxError:
    return VoxError(ErrorCode.MESSAGE_TOO_LARGE, f"request body is larger than {limit} bytes")


def _check_declared_length(request: Request, limit: int) -> None:
    """Refuse at once when Content-Length already says the body is too big."""
    declared = request.headers.get("content-length", "")
    # isascii: str.isdigit() also accepts "²", which int() refuses (found by tests/fuzz).
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)


def require_json_type(request: Request) -> None:
    """A JSON body must be declared `application/json` (parameters such as charset allowed):
    a browser page of another site can send `text/plain` or a form without a CORS
    preflight, but `application/json` only after one, which only listed origins pass."""
    declared = request.headers.get("content-type", "")
    media_type = declared.partition(";")[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE:
        raise VoxError(
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            f"the body must be sent as Content-Type: application/json, not {quoted(declared)}",
        )


async def read_json(
    request: Request, limit: int, max_depth: int = DEFAULT_MAX_DEPTH
) -> dict[str, Any]:
    """The body as a JSON object, read under the byte cap, decoded by json_input (depth
    bounded before parsing, text that cannot be encoded refused)."""
    require_json_type(request)
    _check_declared_length(request, limit)
    raw = await Request(request.scope, _capped(request.receive, limit)).body()
    body = decode_json(raw, max_bytes=limit, max_depth=max_depth, what="request body")
    if not isinstance(body, dict):
        raise VoxError(ErrorCode.INVALID_JSON, "request body must be a JSON object")
    return body


async def read_upload(form: FormData, name: str, limit: int, *, what: str) -> bytes:
    """The bytes of the form's file field `name` (`what`: how the error names it), at
    most `limit` (a declared size over it is refused before reading)."""
    upload = form.get(name)
    if not isinstance(upload, UploadFile):
        raise VoxError(ErrorCode.INVALID_PARAMETER, f"form field {name!r} ({what}) is required")
    if upload.size is not None and upload.size > limit:
        raise VoxError(ErrorCode.MESSAGE_TOO_LARGE, f"the upload is larger than {limit} bytes")
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise VoxError(ErrorCode.MESSAGE_TOO_LARGE, f"the upload is larger than {limit} bytes")
    return data


async def read_form(request: Request, limit: int, *, max_files: int = 1) -> FormData:
    """The body as a form (`max_files` files at most), read under the byte cap. A multipart
    body's files stay in memory (the cap bounds them): Starlette would spool each past 1 MB
    to a temporary file, and an upload is decoded from memory anyway (audio/decode.py)."""
    _check_declared_length(request, limit)
    capped = Request(request.scope, _capped(request.receive, limit))
    media_type = (request.headers.get("content-type") or "").partition(";")[0].strip().lower()
    try:
        if media_type != "multipart/form-data":
            return await capped.form(max_files=max_files, max_fields=MAX_FORM_FIELDS)
        async with contextlib.aclosing(capped.stream()) as stream:
            parser = MultiPartParser(
                capped.headers, stream, max_files=max_files, max_fields=MAX_FORM_FIELDS
            )
            parser.spool_max_size = limit
            return await parser.parse()
    except MultiPartException as exc:  # malformed multipart, too many parts
        raise VoxError(ErrorCode.INVALID_PARAMETER, f"bad multipart form: {exc.message}") from None
    except HTTPException as exc:
        raise VoxError(ErrorCode.INVALID_PARAMETER, f"bad multipart form: {exc.detail}") from None


def one_of(value: str | None, valid: Iterable[str], name: str) -> str | None:
    """`value` unchanged if it is absent or valid; else an error that lists the valid ones."""
    names = list(dict.fromkeys(valid))
    if value is None or value in names:
        return value
    listed = ", ".join(names)
    raise VoxError(ErrorCode.INVALID_PARAMETER, f"unknown {name} {quoted(value)}; valid: {listed}")

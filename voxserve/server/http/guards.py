"""ASGI middlewares that guard every HTTP request before a route sees it.

- `OriginGuard`: a browser page of another site must not use the API. Without API keys
  (the local default) nothing else stops it: a page can POST `text/plain` JSON or a
  multipart form cross-site without a CORS preflight, and the browser sends it with its
  `Origin`. On `/v1/*` a request whose `Origin` is neither the server itself nor listed in
  `cors_allowed_origins` is refused (403 `origin_not_allowed`), keys or not, the same rule
  as the WebSocket's (server/session/auth.py `origin_allowed`). Requests without an `Origin`
  (the openai SDK, curl, other servers) are not browsers' and pass.
- `BodyTimeout`: a request body may not pause longer than `limits.http_body_timeout_s`
  between two reads: the read raises `client_stalled` (408, via the route's error
  handling) and the response closes the connection. Only while the body is being read:
  once it is complete, waiting on `receive` is waiting for a disconnect, which is no
  timeout's business.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from voxserve.errors import ErrorCode, VoxError
from voxserve.server.session.auth import check_origin
from voxserve.server.session.errors import error_response

GUARDED_PREFIX = "/v1/"


class OriginGuard:
    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self.allowed = list(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(GUARDED_PREFIX):
            headers = Headers(scope=scope)
            try:
                check_origin(headers.get("origin"), headers.get("host", ""), self.allowed)
            except VoxError as error:
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyTimeout:
    def __init__(
        self, app: ASGIApp, idle_s: float, count: Callable[[], None] = lambda: None
    ) -> None:
        self.app = app
        self.idle_s = idle_s
        self.count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        idle_s = self.idle_s
        body_done = False
        timed_out = False

        async def timed_receive() -> Message:
            nonlocal body_done, timed_out
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout(idle_s):
                    message = await receive()
            except TimeoutError:
                timed_out = True
                self.count()
                raise VoxError(
                    ErrorCode.CLIENT_STALLED,
                    f"the request body paused for more than {idle_s:g} s",
                ) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def closing_send(message: Message) -> None:
            if timed_out and message["type"] == "http.response.start":
                # The rest of the body may still come: this connection is done with.
                headers = [*message.get("headers", []), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, timed_receive, closing_send)

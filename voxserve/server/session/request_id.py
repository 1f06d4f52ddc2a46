"""Every HTTP answer names its request: `x-request-id` (what OpenAI sends, and what the
openai SDKs read as a response's `request_id` and an error's) and `X-Voxserve-Trace-Id`,
one id, on every route and every refusal: the guards' (Host, Origin, body timeout),
Starlette's own 404 and 405, a WebSocket handshake accepted or refused. The outermost
middleware makes the id and keeps it in the scope's state, where the routes read it
(`trace_id_of`): the id a client quotes is the one the logs carry.

No client header is read: as before, HTTP makes its own trace ids (docs/reliability.md).
"""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "x-request-id"
TRACE_HEADER = "X-Voxserve-Trace-Id"
_STAMPED = ("http.response.start", "websocket.http.response.start", "websocket.accept")


def new_trace_id() -> str:
    return uuid.uuid4().hex[:16]


def trace_id_of(scope: Scope) -> str:
    """The request's trace id (RequestId's), or a new one where no RequestId ran (an app
    built without it: a unit test)."""
    state = scope.setdefault("state", {})
    trace_id = state.get("trace_id")
    if not isinstance(trace_id, str):
        trace_id = state["trace_id"] = new_trace_id()
    return trace_id


class RequestId:
    """ASGI middleware: the request's trace id on its answer's headers (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        trace_id = trace_id_of(scope)
        value = trace_id.encode("ascii")
        ours = ((REQUEST_ID_HEADER.encode(), value), (TRACE_HEADER.lower().encode(), value))

        async def stamped(message: Message) -> None:
            if message["type"] in _STAMPED:
                headers = list(message.get("headers") or ())
                present = {bytes(name).lower() for name, _ in headers}
                headers += [header for header in ours if header[0] not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, stamped)

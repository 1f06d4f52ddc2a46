"""API keys on gRPC: metadata ``authorization: Bearer <key>`` on every voxserve.v1 call.

A server interceptor, so no RPC can forget the check. Health and reflection stay open:
probes and tools use them without a key, and they reveal nothing a client could abuse.
A refused call ends with UNAUTHENTICATED and the voxserve code `unauthorized` in the
trailing metadata, as every other gRPC error does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from voxserve.errors import VoxError
from voxserve.server.grpc.stream import abort
from voxserve.server.session.auth import KeyRing, bearer_token

PROTECTED_PREFIX = "/voxserve.v1.Voxserve/"

if TYPE_CHECKING:  # grpc's runtime classes are not subscriptable
    Continuation = Callable[
        [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
    ]


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, keys: KeyRing) -> None:
        self.keys = keys

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or not self.keys.enabled or not method.startswith(PROTECTED_PREFIX):
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        value = metadata.get("authorization")
        token = bearer_token(value if isinstance(value, str) else None)
        try:
            self.keys.authenticate(token)
        except VoxError as exc:
            return _refusal(handler, exc)
        return handler


def _refusal(
    handler: grpc.RpcMethodHandler[Any, Any], error: VoxError
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape as `handler` that only aborts with `error`."""
    serializers: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await abort(context, error)

    async def streaming(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        await abort(context, error)
        yield  # pragma: no cover - abort raises; this makes the function a generator

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming, **serializers)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, **serializers)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming, **serializers)
    return grpc.unary_unary_rpc_method_handler(unary, **serializers)

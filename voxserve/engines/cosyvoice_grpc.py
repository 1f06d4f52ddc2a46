"""The cosyvoice engine's gRPC client: CosyVoice's `cosyvoice.CosyVoice/Inference` service
(runtime/python/grpc/server.py), one server-streamed call per request.

The channel reconnects by itself when the runtime comes back; its reconnect backoff is
capped at `MAX_RECONNECT_BACKOFF_MS` (gRPC's default grows to two minutes, so a restarted
runtime would be refused that long). A call refused as UNAVAILABLE before any audio (nothing
was made) is sent again every `RETRY_S` for at most `connect_s`: a runtime that is down
fails the call in that time with a clear "unreachable", and one that is back is used as
soon as the channel has reconnected. Each streamed chunk
has a deadline (engines/chunk_deadline.py): gRPC's own deadline bounds the whole call, not
the silence between chunks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc

from voxserve.engines.chunk_deadline import with_chunk_deadline
from voxserve.engines.cosyvoice_proto import cosyvoice_pb2, cosyvoice_pb2_grpc
from voxserve.engines.cosyvoice_request import CosyBusy, CosyFailed, CosyRequest, CosyUnavailable

MAX_RECONNECT_BACKOFF_MS = 1000
CONNECT_S = 2.0  # at most; less when timeout_s is less
RETRY_S = 0.1
MAX_DETAILS_CHARS = 200
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # one chunk is one sentence of audio (~50 KB/s)


class GrpcTransport:
    speeds = False  # the proto has no speed

    def __init__(self, target: str, timeout_s: float) -> None:
        """`target`: host:port of the runtime."""
        self.where = f"grpc://{target}"
        self._timeout_s = timeout_s
        self._connect_s = min(timeout_s, CONNECT_S)
        self._channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        stub_class: Any = cosyvoice_pb2_grpc.CosyVoiceStub  # generated, untyped
        self._stub: Any = stub_class(self._channel)

    def stream(self, request: CosyRequest) -> Iterator[bytes]:
        message = to_message(request)
        give_up = time.monotonic() + self._connect_s
        while True:
            call = self._stub.Inference(message)
            received = 0
            try:
                for response in with_chunk_deadline(call, self._timeout_s):
                    received += 1
                    yield response.tts_audio
                return
            except grpc.RpcError as exc:
                unavailable = _code(exc) == grpc.StatusCode.UNAVAILABLE and received == 0
                if not unavailable or time.monotonic() >= give_up:
                    raise _failure(exc, received) from None
            finally:
                call.cancel()  # a no-op once the call is over; stops it when the caller left
            time.sleep(RETRY_S)

    def close(self) -> None:
        self._channel.close()


def to_message(request: CosyRequest) -> Any:
    """The published proto's Request for `request` (its oneof picks the kind)."""
    message = cosyvoice_pb2.Request()
    if request.kind == "sft":
        message.sft_request.spk_id = request.spk_id
        message.sft_request.tts_text = request.text
    elif request.kind == "instruct":
        message.instruct_request.tts_text = request.text
        message.instruct_request.spk_id = request.spk_id
        message.instruct_request.instruct_text = request.instruct_text
    elif request.kind == "zero_shot":
        assert request.prompt is not None
        message.zero_shot_request.tts_text = request.text
        message.zero_shot_request.prompt_text = request.prompt.text
        message.zero_shot_request.prompt_audio = request.prompt.pcm16k
    else:
        assert request.prompt is not None
        message.cross_lingual_request.tts_text = request.text
        message.cross_lingual_request.prompt_audio = request.prompt.pcm16k
    return message


def _code(exc: grpc.RpcError) -> grpc.StatusCode | None:
    return exc.code() if isinstance(exc, grpc.Call) else None


def _failure(exc: grpc.RpcError, received: int) -> Exception:
    code = _code(exc)
    name = code.name if code is not None else type(exc).__name__
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return CosyBusy(name)
    if code == grpc.StatusCode.UNAVAILABLE and received == 0:
        return CosyUnavailable(name)
    where = "mid-stream" if received else "before any audio"
    return CosyFailed(f"{name} {where}{_details(exc)}")


def _details(exc: grpc.RpcError) -> str:
    """The runtime's own reason, shortened: CosyVoice's gRPC server ends a call whose model
    raised with UNKNOWN and the exception in the details ("Exception iterating responses:
    '中文女'" for a spk_id its model lacks), the one clue to what went wrong."""
    details = exc.details() if isinstance(exc, grpc.Call) else None
    if not details:
        return ""
    return f": {details[:MAX_DETAILS_CHARS]}"

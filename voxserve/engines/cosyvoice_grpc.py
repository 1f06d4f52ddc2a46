"""The cosyvoice engine's gRPC client: CosyVoice's `cosyvoice.CosyVoice/Inference` service
(runtime/python/grpc/server.py), one server-streamed call per request.

The channel reconnects by itself when the runtime comes back; its reconnect backoff is
capped at `MAX_RECONNECT_BACKOFF_MS` (gRPC's default grows to two minutes, so a restarted
runtime would be refused that long). A call does not wait for a down server
(wait_for_ready off): it fails at once and the client hears so. Each streamed chunk has a
deadline (engines/chunk_deadline.py): gRPC's own deadline bounds the whole call, not the
silence between chunks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc

from voxserve.engines.chunk_deadline import with_chunk_deadline
from voxserve.engines.cosyvoice_proto import cosyvoice_pb2, cosyvoice_pb2_grpc
from voxserve.engines.cosyvoice_request import CosyBusy, CosyFailed, CosyRequest, CosyUnavailable

MAX_RECONNECT_BACKOFF_MS = 1000
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # one chunk is one sentence of audio (~50 KB/s)


class GrpcTransport:
    speeds = False  # the proto has no speed

    def __init__(self, target: str, timeout_s: float) -> None:
        """`target`: host:port of the runtime."""
        self.where = f"grpc://{target}"
        self._timeout_s = timeout_s
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
        call = self._stub.Inference(to_message(request))
        received = 0
        try:
            for response in with_chunk_deadline(call, self._timeout_s):
                received += 1
                yield response.tts_audio
        except grpc.RpcError as exc:
            raise _failure(exc, received) from None
        finally:
            call.cancel()  # a no-op once the call is over; stops it when the caller left

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


def _failure(exc: grpc.RpcError, received: int) -> Exception:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    name = code.name if code is not None else type(exc).__name__
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return CosyBusy(name)
    if code == grpc.StatusCode.UNAVAILABLE and received == 0:
        return CosyUnavailable(name)
    where = "mid-stream" if received else "before any audio"
    return CosyFailed(f"{name} {where}")

"""A small gRPC client for tests: paced multi-frame audio requests and response collection,
through the stubs generated from proto/voxserve/v1/voxserve.proto."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np

from voxserve.v1 import voxserve_pb2 as pb
from voxserve.v1 import voxserve_pb2_grpc as pb_grpc

FRAME = 320  # samples in 20 ms at 16 kHz


def stub(channel: grpc.aio.Channel) -> Any:
    return pb_grpc.VoxserveStub(channel)


async def audio_requests(
    request_type: type[Any],
    config: Any,
    samples: np.ndarray,
    *,
    rate: int = 16_000,
    frames_per_message: int = 5,
    speedup: float = 4.0,
    tail: list[Any] | None = None,
) -> AsyncIterator[Any]:
    """The config, then the audio as messages of `frames_per_message` 20 ms frames each,
    paced at `speedup` x real time, then `tail` (more requests), then half-close."""
    yield request_type(config=config)
    frame = rate // 50
    step = frame * frames_per_message
    start = time.monotonic()
    for n, i in enumerate(range(0, samples.size, step)):
        pcm = samples[i : i + step].astype("<i2").tobytes()
        yield request_type(audio=pb.AudioFrames(seq_id=n * frames_per_message, pcm=pcm))
        due = start + (n + 1) * frames_per_message * 0.02 / speedup
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
    for request in tail or []:
        yield request


async def collect(call: Any, limit_s: float = 30.0) -> list[tuple[str, Any]]:
    """Every response of a streaming call as (oneof field, message)."""
    out: list[tuple[str, Any]] = []
    async with asyncio.timeout(limit_s):
        async for response in call:
            kind = response.WhichOneof("event")
            out.append((kind, getattr(response, kind)))
    return out


def of_kind(responses: list[tuple[str, Any]], kind: str) -> list[Any]:
    return [message for k, message in responses if k == kind]


def error_code(error: grpc.aio.AioRpcError) -> str | None:
    """The voxserve code a failed call carries in its trailing metadata."""
    for key, value in error.trailing_metadata() or ():
        if key == "voxserve-error-code":
            return str(value)
    return None

"""Cost of the event send path's own work per event: build a `transcript.partial` and a
`credit` event and encode it for the WebSocket, typed (voxserve/events.py +
ws_protocol.encode_event) against the dict + json.dumps that events were before; and the
gRPC encoding of the same typed events. What decided msgspec Structs over dataclasses.

    .venv/bin/python -m scripts.bench_events     (from the repository root)
"""

from __future__ import annotations

import json
import timeit
from collections.abc import Callable
from typing import Any

from voxserve.events import Credit, TranscriptPartial
from voxserve.server.grpc import events as grpc_events
from voxserve.server.session.stream_protocol import encode_event
from voxserve.v1 import voxserve_pb2 as pb

TEXT = "the quick brown fox jumps over the lazy dog"
RUNS = 100_000


def dict_encode(event: dict[str, Any]) -> str:
    """ws_protocol.encode_event before events were typed."""
    text = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    if not text.isascii():
        text.encode("utf-8")
    return text


def partial_dict() -> str:
    return dict_encode(
        {"type": "transcript.partial", "segment": 3, "text": TEXT, "start_ms": 1200, "end_ms": 3400}
    )


def partial_typed() -> str:
    return encode_event(TranscriptPartial(segment=3, text=TEXT, start_ms=1200, end_ms=3400))


def credit_dict() -> str:
    return dict_encode({"type": "credit", "window": 4, "acked_seq": 1234})


def credit_typed() -> str:
    return encode_event(Credit(window=4, acked_seq=1234))


def partial_grpc() -> object:
    event = TranscriptPartial(segment=3, text=TEXT, start_ms=1200, end_ms=3400)
    return grpc_events.encode_event(event, pb.ConverseResponse)


def ns_per_call(call: Callable[[], object]) -> float:
    return min(timeit.repeat(call, number=RUNS, repeat=5)) / RUNS * 1e9


def main() -> None:
    assert partial_dict() == partial_typed() and credit_dict() == credit_typed()
    for name, old, new in [
        ("transcript.partial", partial_dict, partial_typed),
        ("credit", credit_dict, credit_typed),
    ]:
        before, after = ns_per_call(old), ns_per_call(new)
        print(
            f"{name:20s} build + JSON: dict {before:6.0f} ns, typed {after:6.0f} ns "
            f"({before / after:.1f}x)"
        )
    grpc_ns = ns_per_call(partial_grpc)
    print(f"{'transcript.partial':20s} build + protobuf (Converse): {grpc_ns:.0f} ns")


if __name__ == "__main__":
    main()

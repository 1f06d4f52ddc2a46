"""Who may start work now: the rule every transport applies first, before any audio.

Refusals are immediate and carry a retry hint (`retry_after_s`): the WebSocket closes with
1013, HTTP answers 503 with Retry-After, gRPC UNAVAILABLE. Besides the count of sessions
(`limits.max_sessions`, `voxserve serve --max-sessions`), admission looks at measured load:
while a model stage has been under pressure for `flow.shed_after_s` (queue over its limit,
timeouts, calls starting past their deadline: pipeline/scheduling/flow.py), new work is refused so
the streams already admitted keep their latency; a new live stream, while one more would
take the ASR engine past `flow.asr_busy_limit` at what a stream has been costing it (its
cost shows only once it speaks: pipeline/scheduling/session_demand.py); and while the
process is over its memory
threshold (pipeline/scheduling/memory_guard.py), new work is refused so the work admitted can
finish.
"""

from __future__ import annotations

from voxserve.errors import ErrorCode, VoxError
from voxserve.runtime import Runtime

NOT_READY_RETRY_S = 1


def _refuse(code: ErrorCode, message: str, retry_after_s: int) -> VoxError:
    return VoxError(code, message, fatal=True, retry_after_s=retry_after_s)


def _shed(runtime: Runtime, stage: str, why: str) -> VoxError:
    """A refusal for measured load on `stage`, counted in the shed metric."""
    runtime.metrics.shed.labels(stage).inc()
    return _refuse(
        ErrorCode.OVERLOADED,
        f"the {stage} stage {why}; retry later",
        runtime.settings.flow.retry_after_s,
    )


def admit_request(runtime: Runtime, what: str = "request") -> None:
    """For one-shot requests (HTTP, gRPC Synthesize): readiness, drain, memory and measured
    load. `what` labels a memory refusal in the metrics."""
    if runtime.drain.draining:
        raise _refuse(
            ErrorCode.SHUTTING_DOWN,
            "the server is shutting down; connect to another instance",
            runtime.settings.flow.retry_after_s,
        )
    if not runtime.ready:
        raise _refuse(
            ErrorCode.NOT_READY, "models are still loading; retry shortly", NOT_READY_RETRY_S
        )
    runtime.memory_guard.check(what)
    stage = runtime.flow.overloaded()
    if stage is not None:
        raise _shed(runtime, stage, "is saturated")


def admit(runtime: Runtime, *, parked: int = 0, stream: bool = False) -> None:
    """For sessions (WebSocket, gRPC Converse, Wyoming): the request rule, then the limit on
    live sessions. `parked` sessions (WebSocket, waiting for a resume) do not count: they
    hold no connection and take no new input. `stream`: a live stream's door (WebSocket,
    Realtime, gRPC, WebRTC): refused while one more would take the ASR engine past its
    limit at what a stream has been costing it (pipeline/scheduling/session_demand.py),
    and counted there when admitted; Wyoming's requests have their share and the one-shot
    rule instead."""
    admit_request(runtime, "session")
    stage = runtime.flow.refuses_streams() if stream else None
    if stage is not None:
        raise _shed(runtime, stage, "is at its limit of live streams")
    limit = runtime.settings.limits.max_sessions
    if runtime.active_sessions - parked >= limit:
        raise _refuse(
            ErrorCode.OVERLOADED,
            f"server is at its limit of {limit} sessions; retry later",
            runtime.settings.flow.retry_after_s,
        )
    if stream:
        runtime.flow.stream_admitted()

"""What a session holds of the server while it lives, taken at open and given back once.

Every transport opens its sessions the same way: the global rule first
(`admission.admit`), then the key's quota (`SessionSlot`: a session slot, and later its
audio), then the Session itself (`new_session`); the slot counts the session in
`runtime.active_sessions` and the session metrics from when it starts to when it is
released. Wyoming's requests are sessions of the anonymous caller without a Session:
`open_request` takes the same pieces at once.
"""

from __future__ import annotations

from voxserve.errors import VoxError
from voxserve.events import StreamConfig
from voxserve.pipeline.generations import Lease
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.session import Session
from voxserve.runtime import Runtime
from voxserve.server.session.admission import admit
from voxserve.server.session.auth import cache_scope
from voxserve.server.session.quotas import SessionQuota, quotas_of


class SessionSlot:
    """A session's hold on its key's quota (`quota`: the slot, and its audio) and, once
    counted in (`count_in`), on the session counts. `release` gives back both, once."""

    def __init__(self, runtime: Runtime, principal: str) -> None:
        """Raises `quota_exceeded` (fatal) when the key has no slot left."""
        self.runtime = runtime
        self.quota: SessionQuota = quotas_of(runtime).open_session(principal)
        self._labels: tuple[str, str] | None = None  # counted in as (mode, transport)

    def count_in(self, mode: str, transport: str) -> None:
        runtime = self.runtime
        runtime.active_sessions += 1
        runtime.metrics.sessions_total.labels(mode, transport).inc()
        runtime.metrics.sessions_active.labels(mode, transport).inc()
        self._labels = (mode, transport)

    def release(self) -> None:
        """Give back the quota slot and, if counted in, the place in the counts."""
        self.quota.release()
        labels, self._labels = self._labels, None
        if labels is not None:
            self.runtime.active_sessions -= 1
            self.runtime.metrics.sessions_active.labels(*labels).dec()


def open_request(runtime: Runtime, principal: str, mode: str) -> SessionSlot:
    """A one-request session (Wyoming): admitted, its slot taken and counted in at once."""
    admit(runtime)
    slot = SessionSlot(runtime, principal)
    slot.count_in(mode, "wyoming")
    return slot


def new_session(
    runtime: Runtime, config: StreamConfig, principal: str, *, stall_s: float | None
) -> Session:
    """The Session for `config`, its outbox bounded by settings (`stall_s`: how long output
    may wait for the client, None = as long as it takes). An error is fatal: there is no
    session to go on with."""
    outbox = Outbox(runtime.settings.pipeline.outbox_messages, stall_s)
    try:
        scope = cache_scope(runtime.settings, principal)
        return Session(runtime.session_context(config.model), config, outbox, cache_scope=scope)
    except VoxError as exc:
        exc.fatal = True
        raise


async def chosen_model(runtime: Runtime, model: str | None) -> Lease | None:
    """The named ASR model a session is to start with, loaded and held (None: the default,
    nothing to hold); its errors (`unknown_model`, `model_unavailable`) end the handshake."""
    if not model:
        return None
    try:
        return await runtime.models.lease(asr=model)
    except VoxError as exc:
        exc.fatal = True
        raise


def count_refusal(runtime: Runtime, error: VoxError, transport: str) -> None:
    """A session that never started: the error sent, and the refusal by its reason."""
    runtime.metrics.errors.labels(error.code.value, transport).inc()
    runtime.metrics.refused.labels(error.code.value).inc()

"""Per-key quotas: sessions open at once, requests per second, audio seconds per minute.

Pure bookkeeping with an injected clock, so it is unit-tested on a virtual clock and a
clock that jumps. Every transport calls it where it authenticates: a principal is the key
id (`auth.key_id`), or `anonymous` while auth is off, which is limited only when
`quotas.anonymous` says so (a local server has no tenants to keep apart).

- Sessions: a count per principal, taken at open and given back once (`SessionQuota`).
- Requests: a token bucket (`requests_per_s`, `burst`); opening a session is a request.
- Audio: a token bucket of seconds, `audio_s_per_min` deep, refilled by 1/60 of it every
  second (a sliding minute without a per-frame history); audio is charged as it arrives,
  so speech over quota is refused at once, never queued.

State is one small record per principal; principals are the configured keys (plus
`anonymous`), so memory is bounded by the config, not by clients.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from voxserve.config import QuotaLimits, QuotasConfig
from voxserve.errors import ErrorCode, VoxError
from voxserve.server.session.auth import ANONYMOUS

if TYPE_CHECKING:
    from voxserve.runtime import Runtime

SESSION_RETRY_S = 1  # a session slot frees when another ends: no better hint exists
Clock = Callable[[], float]
_EPSILON = 1e-9  # 30 frames of 0.2 s must fit in 6 s: sums of floats land a hair over


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits that apply to one principal; None = no limit."""

    max_sessions: int | None
    requests_per_s: float | None
    burst: float
    audio_s_per_min: float | None


def resolve(config: QuotasConfig, principal: str) -> Limits:
    """`default`, with the fields a per-key override sets replacing it (0 = no limit)."""
    base = config.default
    override = config.keys.get(principal, QuotaLimits())

    def pick(name: str) -> float | None:
        value = getattr(override, name)
        if value is None:
            value = getattr(base, name)
        return None if value is None or value == 0 else value

    sessions = pick("max_sessions")
    rate = pick("requests_per_s")
    burst = pick("burst") or max(1.0, 2 * (rate or 0))
    audio = pick("audio_s_per_min")
    return Limits(None if sessions is None else int(sessions), rate, float(burst), audio)


class TokenBucket:
    """`capacity` tokens, refilled at `rate` per second. A clock that steps back refills
    nothing (the bucket re-anchors), one that leaps ahead refills at most to capacity."""

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.tokens = capacity
        self.updated = now

    def _refill(self, now: float) -> None:
        elapsed = now - self.updated
        if elapsed > 0:
            self.tokens = min(self.capacity, self.tokens + elapsed * self.rate)
        self.updated = now

    def level(self, now: float) -> tuple[float, float, float]:
        """(capacity, tokens now, seconds until full), read without taking any."""
        self._refill(now)
        return self.capacity, self.tokens, (self.capacity - self.tokens) / self.rate

    def take(self, amount: float, now: float) -> float:
        """0.0 when `amount` was taken; otherwise the seconds until it could be (nothing
        taken)."""
        self._refill(now)
        if self.tokens >= amount - _EPSILON:
            self.tokens = max(0.0, self.tokens - amount)
            return 0.0
        return (amount - self.tokens) / self.rate


class _Principal:
    __slots__ = ("audio", "limits", "requests", "sessions")

    def __init__(self, limits: Limits, now: float) -> None:
        self.limits = limits
        self.sessions = 0
        rate = limits.requests_per_s
        self.requests = TokenBucket(rate, limits.burst, now) if rate else None
        audio = limits.audio_s_per_min
        self.audio = TokenBucket(audio / 60.0, audio, now) if audio else None


def quota_error(what: str, wait_s: float, *, fatal: bool) -> VoxError:
    """`quota_exceeded`, with when to retry in whole seconds (HTTP Retry-After's unit)."""
    retry = max(1, math.ceil(wait_s))
    return VoxError(ErrorCode.QUOTA_EXCEEDED, what, fatal=fatal, retry_after_s=retry)


@dataclass(frozen=True, slots=True)
class AudioVerdict:
    """Whether a piece of audio was accepted; `report` is the error to send, given only for
    the first refusal of a run, so a client streaming over quota gets one event, not one
    per frame (every refused frame is still counted by the transport)."""

    accepted: bool
    report: VoxError | None = None


ACCEPTED = AudioVerdict(True)


class Quotas:
    """The quota book of one server, shared by every transport."""

    def __init__(
        self,
        config: QuotasConfig,
        *,
        clock: Clock = time.monotonic,
        on_refusal: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.on_refusal = on_refusal
        self._principals: dict[str, _Principal] = {}

    def applies(self, principal: str) -> bool:
        return self.config.enabled and (principal != ANONYMOUS or self.config.anonymous)

    def _state(self, principal: str) -> _Principal | None:
        if not self.applies(principal):
            return None
        state = self._principals.get(principal)
        if state is None:
            limits = resolve(self.config, principal)
            state = self._principals[principal] = _Principal(limits, self.clock())
        return state

    def refuse(self, kind: str, error: VoxError) -> VoxError:
        """Count a refusal of `kind` (the metric) and hand the error back to raise."""
        if self.on_refusal is not None:
            self.on_refusal(kind)
        return error

    def request(self, principal: str, *, fatal: bool = False) -> None:
        """Count one request (an HTTP call, a unary RPC, a session opening); raises
        `quota_exceeded` over `requests_per_s`."""
        state = self._state(principal)
        if state is None or state.requests is None:
            return
        wait = state.requests.take(1.0, self.clock())
        if wait:
            rate = state.limits.requests_per_s
            raise self.refuse(
                "requests", quota_error(f"over {rate:g} requests per second", wait, fatal=fatal)
            )

    def open_session(self, principal: str) -> SessionQuota:
        """A session slot for `principal` (also one request); raises `quota_exceeded`
        (fatal) at `max_sessions` or over the request rate. Release it exactly once."""
        state = self._state(principal)
        if state is not None:
            limit = state.limits.max_sessions
            if limit is not None and state.sessions >= limit:
                error = quota_error(
                    f"this key has its limit of {limit} open sessions", SESSION_RETRY_S, fatal=True
                )
                raise self.refuse("sessions", error)
            self.request(principal, fatal=True)
            state.sessions += 1
        return SessionQuota(self, principal, state)

    def charge_audio(self, principal: str, seconds: float) -> float:
        """Take `seconds` of audio from the principal's minute; 0.0 when accepted, else the
        seconds to wait (nothing taken)."""
        state = self._state(principal)
        if state is None or state.audio is None:
            return 0.0
        return state.audio.take(seconds, self.clock())

    def spend_audio(self, principal: str, seconds: float) -> None:
        """`charge_audio` for one-shot requests (an upload, a Wyoming request): raises
        `quota_exceeded` when the audio does not fit in the principal's minute."""
        wait = self.charge_audio(principal, seconds)
        if wait:
            state = self._principals[principal]
            per_min = state.limits.audio_s_per_min
            error = quota_error(f"over {per_min:g} s of audio per minute", wait, fatal=False)
            raise self.refuse("audio", error)

    def requests_left(self, principal: str) -> tuple[float, float, float] | None:
        """(bucket size, requests left now, seconds until it is full) of the principal's
        request rate, read without taking any (the Realtime API's rate_limits.updated);
        None when no request rate applies."""
        state = self._state(principal)
        bucket = None if state is None else state.requests
        return None if bucket is None else bucket.level(self.clock())

    def audio_left(self, principal: str) -> tuple[float, float, float] | None:
        """(seconds a minute, seconds left now, seconds until the minute is full again) of
        the principal's audio quota, read without taking any; None when none applies."""
        state = self._state(principal)
        bucket = None if state is None else state.audio
        return None if bucket is None else bucket.level(self.clock())

    def sessions(self, principal: str) -> int:
        state = self._principals.get(principal)
        return state.sessions if state is not None else 0

    def _release(self, state: _Principal) -> None:
        state.sessions = max(0, state.sessions - 1)


class SessionQuota:
    """One open session's hold on its principal's quota: the slot, and its audio."""

    def __init__(self, quotas: Quotas, principal: str, state: _Principal | None) -> None:
        self.quotas = quotas
        self.principal = principal
        self._state = state
        self._held = state is not None
        self._refusing = False  # the last audio was refused (its error already reported)
        self.refused_s = 0.0  # audio refused over quota, in seconds

    @property
    def charges_audio(self) -> bool:
        """Whether this session's audio counts against a quota (fixed for its life)."""
        return self._state is not None

    def audio(self, seconds: float) -> AudioVerdict:
        """Charge `seconds` of incoming audio; over quota it is refused, not buffered."""
        if self._state is None:  # quotas do not apply to this principal (fixed per process)
            return ACCEPTED
        wait = self.quotas.charge_audio(self.principal, seconds)
        if not wait:
            self._refusing = False
            return ACCEPTED
        self.refused_s += seconds
        if self._refusing:
            return AudioVerdict(False)
        self._refusing = True
        assert self._state is not None and self._state.limits.audio_s_per_min is not None
        per_min = self._state.limits.audio_s_per_min
        error = quota_error(f"over {per_min:g} s of audio per minute", wait, fatal=False)
        return AudioVerdict(False, self.quotas.refuse("audio", error))

    def release(self) -> None:
        """Give the session slot back (idempotent)."""
        if self._held and self._state is not None:
            self._held = False
            self.quotas._release(self._state)


_BOOKS: weakref.WeakKeyDictionary[Runtime, Quotas] = weakref.WeakKeyDictionary()


def quotas_of(runtime: Runtime) -> Quotas:
    """The one quota book of `runtime`, made on first use from its settings (kept beside
    the runtime, not in it, so every transport finds the same book)."""
    book = _BOOKS.get(runtime)
    if book is None:
        refused = runtime.metrics.quota_refusals
        book = _BOOKS[runtime] = Quotas(
            runtime.settings.quotas, on_refusal=lambda kind: refused.labels(kind).inc()
        )
    return book

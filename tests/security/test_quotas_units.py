"""Per-key quotas on a virtual clock: sessions, requests per second, audio per minute,
overrides by key id, the anonymous principal, and a clock that jumps."""

from __future__ import annotations

import pytest

from voxserve.config import QuotaLimits, QuotasConfig
from voxserve.errors import ErrorCode, VoxError
from voxserve.server.session.quotas import Quotas, TokenBucket, resolve


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def book(**default: float | int | None) -> tuple[Quotas, Clock, list[str]]:
    clock = Clock()
    refusals: list[str] = []
    config = QuotasConfig(default=QuotaLimits(**default))  # type: ignore[arg-type]
    return Quotas(config, clock=clock, on_refusal=refusals.append), clock, refusals


def test_overrides_replace_only_the_fields_they_set_and_zero_means_no_limit() -> None:
    config = QuotasConfig(
        default=QuotaLimits(max_sessions=4, requests_per_s=10, audio_s_per_min=60),
        keys={"abcd1234": QuotaLimits(max_sessions=1, audio_s_per_min=0)},
    )
    own = resolve(config, "abcd1234")
    assert (own.max_sessions, own.requests_per_s, own.audio_s_per_min) == (1, 10, None)
    other = resolve(config, "ffff0000")
    assert (other.max_sessions, other.requests_per_s, other.audio_s_per_min) == (4, 10, 60)
    assert other.burst == 20  # no burst given: twice the rate


def test_sessions_per_key_are_counted_and_released_once() -> None:
    quotas, _, refusals = book(max_sessions=2)
    first = quotas.open_session("k1")
    quotas.open_session("k1")
    with pytest.raises(VoxError) as refused:
        quotas.open_session("k1")
    assert refused.value.code is ErrorCode.QUOTA_EXCEEDED
    assert refused.value.fatal and refused.value.retry_after_s == 1
    assert refusals == ["sessions"]
    quotas.open_session("k2")  # another key has its own count
    first.release()
    first.release()  # idempotent: a double release must not free a slot it does not hold
    assert quotas.sessions("k1") == 1
    quotas.open_session("k1")
    assert quotas.sessions("k1") == 2


def test_requests_per_second_is_a_token_bucket() -> None:
    quotas, clock, refusals = book(requests_per_s=2, burst=3)
    for _ in range(3):
        quotas.request("k")
    with pytest.raises(VoxError) as refused:
        quotas.request("k")
    assert refused.value.retry_after_s == 1  # 0.5 s to the next token, in whole seconds
    assert not refused.value.fatal
    clock.now += 0.5
    quotas.request("k")
    with pytest.raises(VoxError):
        quotas.request("k")
    assert refusals == ["requests", "requests"]


def test_opening_a_session_is_a_request_and_a_refused_one_holds_no_slot() -> None:
    quotas, _, refusals = book(requests_per_s=1, burst=1, max_sessions=5)
    quotas.open_session("k")
    with pytest.raises(VoxError):
        quotas.open_session("k")
    assert quotas.sessions("k") == 1
    assert refusals == ["requests"]


def test_audio_per_minute_refuses_then_recovers_and_reports_once_per_run() -> None:
    quotas, clock, refusals = book(audio_s_per_min=6)  # 0.1 s of audio back per second
    session = quotas.open_session("k")
    for _ in range(30):
        assert session.audio(0.2).accepted
    first = session.audio(0.2)
    assert not first.accepted and first.report is not None
    assert first.report.code is ErrorCode.QUOTA_EXCEEDED and not first.report.fatal
    assert first.report.retry_after_s == 2  # 0.2 s of audio needs 2 s of refill
    again = session.audio(0.2)
    assert not again.accepted and again.report is None  # same run: counted, not re-reported
    assert session.refused_s == pytest.approx(0.4)
    clock.now += 2.0
    assert session.audio(0.2).accepted
    clock.now += 0.5
    assert session.audio(0.2).report is not None  # a new run is reported again
    assert refusals == ["audio", "audio"]


def test_spend_audio_raises_for_one_shot_requests() -> None:
    quotas, _, _ = book(audio_s_per_min=60)
    quotas.spend_audio("k", 59.0)
    with pytest.raises(VoxError) as refused:
        quotas.spend_audio("k", 2.0)
    assert refused.value.code is ErrorCode.QUOTA_EXCEEDED
    assert refused.value.retry_after_s == 1


def test_anonymous_is_limited_only_when_configured() -> None:
    limits = QuotaLimits(max_sessions=1)
    off = Quotas(QuotasConfig(default=limits))
    off.open_session("anonymous")
    off.open_session("anonymous")  # auth off, quotas.anonymous false: no limit
    on = Quotas(QuotasConfig(default=limits, anonymous=True))
    on.open_session("anonymous")
    with pytest.raises(VoxError):
        on.open_session("anonymous")
    disabled = Quotas(QuotasConfig(default=limits, enabled=False))
    disabled.open_session("k")
    disabled.open_session("k")


def test_a_clock_that_jumps_neither_mints_nor_loses_tokens_beyond_the_bucket() -> None:
    bucket = TokenBucket(rate=1.0, capacity=5.0, now=100.0)
    for _ in range(5):
        assert bucket.take(1.0, 100.0) == 0.0
    assert bucket.take(1.0, 10.0) > 0  # stepped back 90 s: no refill, no crash
    assert bucket.take(1.0, 11.0) == 0.0  # re-anchored: 1 s later, one token
    assert bucket.take(1.0, 1e9) == 0.0  # leapt ahead: full, but no more than capacity
    taken = sum(bucket.take(1.0, 1e9) == 0.0 for _ in range(10))
    assert taken == 4

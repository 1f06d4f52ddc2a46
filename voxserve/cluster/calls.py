"""Remote calls with the gateway's rules: a credit per call, a deadline, retries on a lost
replica, refusals and misses fed back to the credit window.

Blocking, for executor threads (the engine protocol's contract). Ray's handle has no
deadline on a streamed chunk, so a timer cancels the call when a chunk is late.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from voxserve.cluster.failures import (
    is_deployment_down,
    is_lost_replica,
    is_refusal,
    overloaded,
    timed_out,
    unavailable,
)
from voxserve.engines.chunk_deadline import ChunkLate, with_chunk_deadline
from voxserve.engines.credits import TierCredits
from voxserve.errors import VoxError


class TierClient:
    """Calls to one core deployment, sharing the tier's credit window."""

    def __init__(
        self,
        tier: str,
        handle: Any,
        credits: TierCredits,
        *,
        retries: int,
        on_refused: Callable[[], VoxError] | None = None,
    ) -> None:
        self.tier = tier
        self.handle = handle
        self.credits = credits
        self.retries = retries
        self._refused = on_refused or (lambda: overloaded(tier))
        self.failovers = 0  # calls sent again after a lost replica

    def _take_credit(self) -> None:
        if not self.credits.acquire():
            raise self._refused()

    def _send(self, method: str, model_id: str, stream: bool, args: tuple[Any, ...]) -> Any:
        """Start the call; a credit taken for it is given back if even that fails."""
        try:
            routed = self.handle.options(
                method_name=method, multiplexed_model_id=model_id, stream=stream
            )
            return routed.remote(*args)
        except BaseException:
            self.credits.release()
            raise

    def call(self, method: str, model_id: str, timeout_s: float, *args: Any) -> Any:
        """One unary call; a lost replica is retried (the gateway still holds the input)."""
        attempt = 0
        while True:
            self._take_credit()
            response = self._send(method, model_id, False, args)
            try:
                result = response.result(timeout_s=timeout_s)
            except TimeoutError:
                response.cancel()
                self.credits.missed()
                raise timed_out(self.tier, timeout_s) from None
            except Exception as exc:
                if is_refusal(exc):
                    self.credits.refused()
                    raise self._refused() from None
                self.credits.release()
                if is_deployment_down(exc):
                    raise unavailable(self.tier, exc) from exc
                if is_lost_replica(exc) and attempt < self.retries:
                    attempt += 1
                    self.failovers += 1
                    continue
                if is_lost_replica(exc):
                    raise unavailable(self.tier, exc) from exc
                raise
            self.credits.success()
            return result

    def stream(
        self, method: str, model_id: str, chunk_timeout_s: float, *args: Any
    ) -> Iterator[Any]:
        """A streamed call; after a lost replica it resumes on another one, asking it to
        skip the items already received (the last argument is that count).

        The credit is given back at the first item: it counts calls waiting for the core
        to answer (the queueing that backpressure is about), not replies the pipeline is
        still playing out at real-time pace. Late items and refusals after it still
        shrink the window."""
        received = 0
        attempt = 0
        while True:
            self._take_credit()
            response = self._send(method, model_id, True, (*args, received))
            credit = _Credit(self.credits)
            try:
                for item in with_chunk_deadline(response, chunk_timeout_s):
                    credit.settle(self.credits.success)
                    received += 1
                    yield item
                credit.settle(self.credits.success)
                return
            except ChunkLate:
                credit.settle(self.credits.missed, pressure=self.credits.shrink)
                raise timed_out(self.tier, chunk_timeout_s) from None
            except GeneratorExit:  # the caller closed the stream: barge-in, a client gone
                response.cancel()
                raise
            except Exception as exc:
                if is_refusal(exc):
                    credit.settle(self.credits.refused, pressure=self.credits.shrink)
                    if received == 0:
                        raise self._refused() from None
                    raise overloaded(self.tier) from None
                if is_deployment_down(exc):
                    raise unavailable(self.tier, exc) from exc
                if not is_lost_replica(exc):
                    raise
                if attempt >= self.retries:
                    raise unavailable(self.tier, exc) from exc
                attempt += 1
                self.failovers += 1
            finally:
                credit.settle(self.credits.release)


class _Credit:
    """One call's credit: settled exactly once (the first outcome wins); an outcome that
    comes after it was settled only adds its pressure, if any."""

    def __init__(self, credits: TierCredits) -> None:
        self._credits = credits
        self._held = True

    def settle(
        self, outcome: Callable[[], None], *, pressure: Callable[[], None] | None = None
    ) -> None:
        if self._held:
            self._held = False
            outcome()
        elif pressure is not None:
            pressure()

"""The decoded-audio budget: bytes of decoded upload audio that all requests of this process
may hold at once (`limits.max_decoded_audio_bytes`).

An upload reserves what its decode will hold before the decoder makes it: the length its
header declares when it is admitted, then each window before that window is decoded (a file
that declares nothing, or lies). The memory guard is asked with the same bytes, so it sees
them before they exist, not after. A reservation that does not fit waits `wait_s` for others
to end, then is refused (503 `overloaded` with Retry-After): seven uploads of an hour each
queue or are refused instead of taking the process past its memory."""

from __future__ import annotations

import asyncio

from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.scheduling.memory_guard import MIB, MemoryGuard

WAIT_S = 2.0  # how long a reservation may wait for others' to end before it is refused


class DecodedAudioBudget:
    """`capacity` bytes shared by every `Reservation`; used on the event loop only."""

    def __init__(
        self,
        capacity: int,
        *,
        memory_guard: MemoryGuard | None = None,
        retry_after_s: int = 1,
        wait_s: float = WAIT_S,
    ) -> None:
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        self.refusals = 0
        self._guard = memory_guard
        self._retry_after_s = retry_after_s
        self._wait_s = wait_s
        self._waiters: set[asyncio.Future[None]] = set()

    async def reserve(self, nbytes: int) -> Reservation:
        """A reservation of `nbytes` (waits, or raises `overloaded`)."""
        reservation = Reservation(self)
        await reservation.grow_to(nbytes)
        return reservation

    async def _take(self, nbytes: int) -> None:
        if self._guard is not None:
            self._guard.check("upload", coming_bytes=nbytes)
        if not self._fits(nbytes):
            try:
                async with asyncio.timeout(self._wait_s):
                    while not self._fits(nbytes):
                        waiter = asyncio.get_running_loop().create_future()
                        self._waiters.add(waiter)
                        try:
                            await waiter
                        finally:
                            self._waiters.discard(waiter)
            except TimeoutError:
                self.refusals += 1
                raise VoxError(
                    ErrorCode.OVERLOADED,
                    f"uploads being decoded hold the server's decoded-audio budget "
                    f"({self.capacity // MIB} MiB, limits.max_decoded_audio_bytes); retry later",
                    fatal=True,
                    retry_after_s=self._retry_after_s,
                ) from None
        self.used += nbytes
        self.peak = max(self.peak, self.used)

    def _fits(self, nbytes: int) -> bool:
        return self.used + nbytes <= self.capacity

    def _give_back(self, nbytes: int) -> None:
        self.used -= nbytes
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)


class Reservation:
    """Bytes one upload holds in the budget until `release` (or `aclose`: a streamed
    response's body closes it when it ends)."""

    def __init__(self, budget: DecodedAudioBudget) -> None:
        self._budget = budget
        self.nbytes = 0

    async def grow_to(self, nbytes: int) -> None:
        """Hold at least `nbytes` (waits, or raises `overloaded`)."""
        if nbytes > self.nbytes:
            await self._budget._take(nbytes - self.nbytes)
            self.nbytes = nbytes

    def shrink_to(self, nbytes: int) -> None:
        if nbytes < self.nbytes:
            self._budget._give_back(self.nbytes - nbytes)
            self.nbytes = nbytes

    def release(self) -> None:
        self.shrink_to(0)

    async def aclose(self) -> None:
        self.release()

"""The live WebRTC calls of this process: found by id for a hang-up (only by the key that
made the call), all ended at shutdown. A call leaves the registry when it is over."""

from __future__ import annotations

import asyncio
from typing import Protocol

from voxserve.errors import ErrorCode, VoxError, quoted


class LiveCall(Protocol):
    """A call as the registry sees it (webrtc_calls.Call)."""

    @property
    def call_id(self) -> str: ...

    @property
    def owner(self) -> str: ...

    @property
    def secret_digest(self) -> bytes | None: ...

    def hang_up(self) -> None: ...

    async def wait_ended(self) -> None: ...


class CallRegistry:
    def __init__(self) -> None:
        self._calls: dict[str, LiveCall] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._calls

    def add(self, call: LiveCall) -> None:
        self._calls[call.call_id] = call

    def remove(self, call: LiveCall) -> None:
        if self._calls.get(call.call_id) is call:
            del self._calls[call.call_id]

    def get(self, call_id: str) -> LiveCall:
        """The live call `call_id`; `call_not_found` otherwise."""
        call = self._calls.get(call_id)
        if call is None:
            raise self.not_found(call_id)
        return call

    def find(self, call_id: str, owner: str) -> LiveCall:
        """The live call `call_id` made by key `owner`; `call_not_found` otherwise (someone
        else's call is not found either: its existence is not told)."""
        call = self.get(call_id)
        if call.owner != owner:
            raise self.not_found(call_id)
        return call

    @staticmethod
    def not_found(call_id: str) -> VoxError:
        return VoxError(ErrorCode.CALL_NOT_FOUND, f"no live call {quoted(call_id[:64])}")

    async def close_all(self, timeout_s: float) -> None:
        """Hang up every call and wait (at most `timeout_s`) for them to be freed."""
        calls = list(self._calls.values())
        for call in calls:
            call.hang_up()
        if calls:
            waits = [asyncio.ensure_future(call.wait_ended()) for call in calls]
            _, pending = await asyncio.wait(waits, timeout=timeout_s)
            for wait in pending:
                wait.cancel()

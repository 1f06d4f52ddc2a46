"""SEAM (issue 22, branch i22-call): stand-ins for the media (i22-media: webrtc_inbound,
webrtc_outbound) and link (i22-link: webrtc_link) modules until they are merged. The call
module takes the real ones when they import; delete this module once they have landed.

`SeamInbound` only reads the caller's track (so aiortc's queue does not grow) and stamps
`last_packet_at`; `SeamLink` sends `session.created` and then the session's events on the
channel until the hang-up or the session's end. No audio reaches the session through them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from aiortc import AudioStreamTrack, MediaStreamTrack, RTCDataChannel
from aiortc.mediastreams import MediaStreamError

from voxserve.runtime import Runtime
from voxserve.server.realtime_events import RealtimeEncoder
from voxserve.server.realtime_session import RealtimeWire
from voxserve.server.session_driver import SessionDriver


class SeamOutbound(AudioStreamTrack):
    """Silence on the outgoing track (aiortc's AudioStreamTrack)."""


class SeamInbound:
    def __init__(self, track: MediaStreamTrack) -> None:
        self.track = track
        self.last_packet_at = 0.0
        self.packets_received = 0

    async def read(self) -> bytes | None:
        try:
            await self.track.recv()
        except MediaStreamError:
            return None
        self.packets_received += 1
        self.last_packet_at = time.monotonic()
        return b""


class SeamLink:
    def __init__(
        self,
        driver: SessionDriver,
        wire: RealtimeWire,
        channel: RTCDataChannel,
        inbound: Any,
        outbound: Any,
        runtime: Runtime,
    ) -> None:
        self.driver = driver
        self.channel = channel
        self.inbound = inbound
        self.encoder = RealtimeEncoder(wire)
        self._gone = asyncio.Event()

    def hang_up(self) -> None:
        self._gone.set()

    async def run(self) -> None:
        self.driver.announce()
        for text in self.encoder.encode(self.driver.session.started_event()):
            self.channel.send(text)
        reader = asyncio.ensure_future(self._read())
        gone = asyncio.ensure_future(self._gone.wait())
        sender = asyncio.ensure_future(self._send())
        try:
            await asyncio.wait([reader, gone, sender], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, gone, sender):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _send(self) -> None:
        """The outbox's events on the channel (audio bytes dropped) until it closes."""
        outbox = self.driver.session.outbox
        while (item := await outbox.next()) is not None:
            if not isinstance(item, bytes) and self.channel.readyState == "open":
                for text in self.encoder.encode(item):
                    self.channel.send(text)

    async def _read(self) -> None:
        while await self.inbound.read() is not None:
            pass

"""The WebRTC floor: a bare aiortc peer that answers `POST /v1/realtime/calls` as voxserve
does (an SDP offer in, 201 with the answer and a Location out) and echoes the caller's audio
back on the same track, and does nothing else: no session, no events, no pipeline.

Every call it carries pays what aiortc itself costs a call (ICE, DTLS, SRTP both ways,
RTP/RTCP, the jitter buffer, an Opus decode and an Opus encode every 20 ms, the data
channel's SCTP) and nothing voxserve adds, so a voxserve call's CPU over this one's, in the
same run with the same callers (scripts/bench_webrtc_floor.py), is the WebRTC counterpart of
`bench baseline`'s ratio to the bare WebSocket echo (echo_server.py).

Run: python -m voxserve.bench.webrtc_echo --port PORT   (loopback only)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import signal

from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaRelay
from aiortc.mediastreams import MediaStreamTrack

CALLS = "/v1/realtime/calls"


class EchoPeer:
    """The calls in progress, by id; DELETE Location ends one."""

    def __init__(self) -> None:
        self.calls: dict[str, RTCPeerConnection] = {}
        self.relay = MediaRelay()
        self.ids = itertools.count(1)

    async def create(self, request: web.Request) -> web.Response:
        if request.content_type != "application/sdp":
            return web.Response(status=415, text="send the offer as application/sdp")
        offer = await request.text()
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        call_id = f"echo_{next(self.ids)}"
        self.calls[call_id] = pc

        @pc.on("track")
        def _track(track: MediaStreamTrack) -> None:
            # The caller's audio, decoded, becomes the answer's outgoing track: encoded again
            # every 20 ms, as a voxserve call encodes its reply (or silence) every 20 ms.
            pc.addTrack(self.relay.subscribe(track))

        @pc.on("connectionstatechange")
        async def _state() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self._end(call_id)

        await pc.setRemoteDescription(RTCSessionDescription(offer, "offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        return web.Response(
            status=201,
            text=pc.localDescription.sdp,
            content_type="application/sdp",
            headers={"Location": f"{CALLS}/{call_id}"},
        )

    async def delete(self, request: web.Request) -> web.Response:
        await self._end(request.match_info["call_id"])
        return web.Response(status=200)

    async def _end(self, call_id: str) -> None:
        pc = self.calls.pop(call_id, None)
        if pc is not None:
            await pc.close()

    async def close(self) -> None:
        for call_id in list(self.calls):
            await self._end(call_id)


async def main(port: int) -> None:
    peer = EchoPeer()
    app = web.Application()
    app.router.add_post(CALLS, peer.create)
    app.router.add_delete(CALLS + "/{call_id}", peer.delete)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"webrtc echo on 127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    with contextlib.suppress(Exception):
        await peer.close()
    await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(main(parser.parse_args().port))

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
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaRelay
from aiortc.mediastreams import MediaStreamTrack
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

CALLS = "/v1/realtime/calls"


class EchoPeer:
    """The calls in progress, by id; DELETE Location ends one."""

    def __init__(self) -> None:
        self.calls: dict[str, RTCPeerConnection] = {}
        self.relay = MediaRelay()
        self.ids = itertools.count(1)

    async def create(self, request: Request) -> Response:
        if request.headers.get("content-type", "").split(";")[0] != "application/sdp":
            return Response("send the offer as application/sdp", status_code=415)
        offer = (await request.body()).decode()
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
        return Response(
            pc.localDescription.sdp,
            status_code=201,
            media_type="application/sdp",
            headers={"Location": f"{CALLS}/{call_id}"},
        )

    async def delete(self, request: Request) -> Response:
        await self._end(request.path_params["call_id"])
        return Response(status_code=200)

    async def _end(self, call_id: str) -> None:
        pc = self.calls.pop(call_id, None)
        if pc is not None:
            await pc.close()

    async def close(self) -> None:
        for call_id in list(self.calls):
            await self._end(call_id)


def app() -> Starlette:
    peer = EchoPeer()

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        await peer.close()

    routes = [
        Route(CALLS, peer.create, methods=["POST"]),
        Route(CALLS + "/{call_id}", peer.delete, methods=["DELETE"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    uvicorn.run(app(), host="127.0.0.1", port=port, log_level="warning")

"""One call's RTCPeerConnection (aiortc): the offer checked and answered, the caller's track
and the `oai-events` data channel awaited, and the watches that say the peer is gone.

The answer is made with our outgoing track on the audio transceiver (sendrecv) and every
host candidate in it (aiortc gathers before `setLocalDescription` returns: no trickle, as
OpenAI's answer). Gone: ICE/DTLS failed or closed (aioice's consent checks, RFC 7675, end a
connection whose peer stopped answering), or no RTP from the peer for
`webrtc.media_timeout_s` (a peer that vanished without a BYE). aiortc is imported here and
only here (with webrtc_ports); callers import this module once they know it is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

# pyOpenSSL imports this inside the first call's DTLS handshake, on the event loop (~20 ms
# here): now, with this module.
import cryptography.hazmat.primitives.serialization  # noqa: F401
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCIceGatherer,
    RTCIceServer,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc import sdp as aiortc_sdp

from voxserve.config import WebRtcConfig
from voxserve.errors import ErrorCode, VoxError
from voxserve.server.webrtc.inbound import InboundAudio
from voxserve.server.webrtc.link import LABEL
from voxserve.server.webrtc.offer import check_structure, invalid_sdp
from voxserve.server.webrtc.outbound import OutboundTrack
from voxserve.server.webrtc.ports import PortRange, PortsExhausted

log = logging.getLogger(__name__)
# aioice logs every candidate pair check at info (a dozen lines a call, with addresses):
# its warnings are enough in a server's log.
logging.getLogger("aioice").setLevel(logging.WARNING)

CHANNEL_LABEL = LABEL  # the Realtime events' data channel (OpenAI's name)
MAX_SDP_BYTES = 64 * 1024  # an offer is a few kB; more is not an offer
# Without BUNDLE each m-line takes its own ports: a bound, so one offer cannot take a range.
MAX_MEDIA = 4
# ICE checks every remote candidate (STUN requests, retransmitted): an offer naming hundreds
# of addresses would have the server send to each. A browser lists a few per interface.
MAX_CANDIDATES = 50  # per m-line
GONE_STATES = ("failed", "closed")
# Client events sent as the channel opens (OpenAI's browser sample sends session.update in
# `onopen`), held until the link takes over; past this many they are counted, not kept (the
# link tells the caller how many were dropped: a flood before session.created is no
# client's).
MAX_EARLY = 64
FLUSH_S = 1.0  # at close, the channel's last events (session.ended) get this long to go out


def ice_servers(config: WebRtcConfig) -> list[RTCIceServer]:
    """webrtc.ice_servers as aiortc's (an empty list, never None: aiortc would add Google's
    STUN server, and a server that cannot reach it waits 5 s for nothing)."""
    return [
        RTCIceServer(
            urls=server.urls,
            username=server.username,
            credential=server.credential.get_secret_value() if server.credential else None,
        )
        for server in config.ice_servers
    ]


# What aiortc raises on an offer it cannot take (its parser and its negotiation use bare
# asserts, int(), dict lookups): the offer's fault, `invalid_sdp`, never a 500.
OFFER_FAULTS = (ValueError, LookupError, AssertionError, TypeError, AttributeError)


def check_offer(text: str) -> None:
    """An SDP offer voxserve can answer: parsed, with an audio m-line (the caller's voice)
    and an application m-line (the data channel over SCTP), of the structure
    server/webrtc/offer.py checks; `invalid_sdp` otherwise."""
    if not text.strip():
        raise invalid_sdp("the SDP offer is empty")
    if len(text.encode("utf-8", "replace")) > MAX_SDP_BYTES:
        raise invalid_sdp(f"the SDP offer is larger than {MAX_SDP_BYTES} bytes")
    if not text.lstrip().startswith("v=0"):
        raise invalid_sdp("the body is not an SDP offer (it must begin with v=0)")
    try:
        parsed = aiortc_sdp.SessionDescription.parse(text)
    except Exception as exc:  # aiortc's parser raises what it meets (ValueError, KeyError...)
        raise invalid_sdp(f"the SDP offer could not be parsed ({type(exc).__name__})") from None
    if len(parsed.media) > MAX_MEDIA:
        raise invalid_sdp(
            f"the SDP offer has {len(parsed.media)} m-lines; a call takes at most {MAX_MEDIA} "
            "(one audio track and the data channel)"
        )
    for media in parsed.media:
        if len(media.ice_candidates) > MAX_CANDIDATES:
            raise invalid_sdp(
                f"the SDP offer's {media.kind} m-line has {len(media.ice_candidates)} ICE "
                f"candidates; at most {MAX_CANDIDATES} are taken"
            )
    kinds = {media.kind for media in parsed.media}
    if "audio" not in kinds:
        raise invalid_sdp("the SDP offer has no audio m-line: add a microphone track")
    if "application" not in kinds:
        raise invalid_sdp(
            f"the SDP offer has no application m-line: create the {CHANNEL_LABEL!r} data "
            "channel before the offer"
        )
    check_structure(text)


class _PeerConnection(RTCPeerConnection):
    """aiortc's, with its connect task's failure kept (a negotiation aiortc cannot finish
    raised in a task nobody awaits: "exception was never retrieved"): the call is told
    (`on_failed`) and ends as a peer that is gone."""

    on_failed: Callable[[BaseException], None] | None = None

    async def _RTCPeerConnection__connect(self) -> None:
        try:
            # aiortc's private task (name-mangled): the one place it runs a negotiation
            await super()._RTCPeerConnection__connect()  # type: ignore[misc]
        except Exception as exc:
            if self.on_failed is not None:
                self.on_failed(exc)


class Peer:
    """The peer connection of one call (module docstring): `outbound`, the reply's track;
    `inbound`, the caller's audio (None while it has sent no track: a listen-only offer)."""

    def __init__(self, config: WebRtcConfig, ports: PortRange) -> None:
        self.config = config
        self.ports = ports
        self.pc = _PeerConnection(RTCConfiguration(iceServers=ice_servers(config)))
        self.pc.on_failed = self._connect_failed
        self.channel: RTCDataChannel | None = None
        self.inbound: InboundAudio | None = None
        self.outbound = OutboundTrack()
        self.gone = asyncio.Event()  # ICE/DTLS failed or closed, or the call hangs up
        self.lost = False  # the peer itself is gone (not a hang-up): nothing to flush
        self._channel_open = asyncio.Event()
        self.early: list[str | bytes] = []  # channel messages before the link took over
        self.early_dropped = 0  # ... and those past MAX_EARLY, only counted
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_state)

    def _on_track(self, track: MediaStreamTrack) -> None:
        """The caller's audio, read through InboundAudio, which puts its jitter buffer in
        the receiver now, before media flows."""
        if track.kind != "audio" or self.inbound is not None:
            return
        receiver = next((r for r in self.pc.getReceivers() if r.track is track), None)
        self.inbound = InboundAudio(track, receiver=receiver)

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != CHANNEL_LABEL or self.channel is not None:
            return  # only one channel carries the events; others are left unused
        self.channel = channel
        channel.on("message", self._early)
        if channel.readyState == "open":
            self._channel_open.set()
        else:
            channel.on("open", self._channel_open.set)
        channel.on("close", self._lost)

    def _early(self, data: str | bytes) -> None:
        if len(self.early) < MAX_EARLY:
            self.early.append(data)
        else:
            self.early_dropped += 1

    def take_early(self) -> list[str | bytes]:
        """The messages that came before the link, no longer held here: the link takes
        the channel's messages from now on (call it with the link's construction, with no
        await between)."""
        if self.channel is not None:
            self.channel.remove_listener("message", self._early)
        early, self.early = self.early, []
        return early

    def _on_state(self) -> None:
        if self.pc.connectionState in GONE_STATES:
            self._lost()

    def _lost(self) -> None:
        self.lost = True
        self.gone.set()

    def _connect_failed(self, error: BaseException) -> None:
        log.info("call negotiation failed", extra={"error": type(error).__name__})
        self._lost()

    async def answer(self, offer: str) -> str:
        """The SDP answer to `offer` (checked by `check_offer` first), `outbound` on the
        audio transceiver, host candidates on the port range."""
        outbound = self.outbound
        check_offer(offer)
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        except Exception as exc:  # aiortc refuses what it cannot take (ValueError mostly)
            raise invalid_sdp(f"the SDP offer was refused: {exc}"[:300]) from None
        self.pc.addTrack(outbound)
        for transceiver in self.pc.getTransceivers():
            if transceiver.kind == "audio" and transceiver.sender.track is outbound:
                transceiver.direction = "sendrecv"
        for gatherer in self._gatherers():
            self.ports.install(gatherer._connection)
        try:
            await self.pc.setLocalDescription(await self.pc.createAnswer())
        except PortsExhausted as exc:
            raise VoxError(ErrorCode.OVERLOADED, str(exc), fatal=True, retry_after_s=1) from None
        except OFFER_FAULTS as exc:  # an offer aiortc took but cannot answer
            name = type(exc).__name__
            raise invalid_sdp(f"the SDP offer could not be answered ({name})") from None
        local = self.pc.localDescription
        return local.sdp

    def _gatherers(self) -> list[RTCIceGatherer]:
        """The ICE gatherers the answer will gather on (one with BUNDLE)."""
        found: list[RTCIceGatherer] = []
        transports = [t.receiver.transport for t in self.pc.getTransceivers()]
        if self.pc.sctp is not None:
            transports.append(self.pc.sctp.transport)
        for dtls in transports:
            gatherer = dtls.transport.iceGatherer
            if all(gatherer is not g for g in found):
                found.append(gatherer)
        return found

    async def connected(self, timeout_s: float) -> bool:
        """Whether the data channel opened (ICE, DTLS and SCTP up) within `timeout_s`; False
        when it did not, or the peer went first."""
        opened = asyncio.ensure_future(self._channel_open.wait())
        gone = asyncio.ensure_future(self.gone.wait())
        try:
            await asyncio.wait([opened, gone], timeout=timeout_s, return_when="FIRST_COMPLETED")
        finally:
            opened.cancel()
            gone.cancel()
        return self._channel_open.is_set() and not self.gone.is_set()

    async def watch_media(self) -> None:
        """Return when the peer has sent no RTP for `media_timeout_s`, counted from its last
        packet off the network (InboundAudio.last_heard_at), or from now before the first.
        Never returns without a caller's track (a listen-only caller: ICE consent alone
        tells a vanished peer)."""
        timeout = self.config.media_timeout_s
        started = time.monotonic()
        while True:
            inbound = self.inbound
            last = started if inbound is None else max(inbound.last_heard_at, started)
            left = last + timeout - time.monotonic()
            if left <= 0 and inbound is not None:
                return
            await asyncio.sleep(min(left, 1.0) if left > 0 else 1.0)

    async def close(self) -> None:
        """Close the connection: its sockets (the ports) are given back. The channel's
        last events are let out first (closing aborts the SCTP association, and what it
        still holds would be lost), unless the peer is gone."""
        if not self.lost:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FLUSH_S):
                    while not self._flushed():  # noqa: ASYNC110 (aiortc has no event for it)
                        await asyncio.sleep(0.01)
        with contextlib.suppress(Exception):
            await self.pc.close()
        if self.inbound is not None:
            self.inbound.close()
        self.outbound.stop()
        self.gone.set()

    def _flushed(self) -> bool:
        """The channel holds nothing and the peer acknowledged all that was sent."""
        channel, sctp = self.channel, self.pc.sctp
        if channel is None or sctp is None or channel.readyState != "open":
            return True
        queued = getattr(sctp, "_outbound_queue", ()) or getattr(sctp, "_sent_queue", ())
        return channel.bufferedAmount == 0 and not queued

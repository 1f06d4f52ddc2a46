"""Both media ends through real aiortc peers on localhost UDP: Opus encode, SRTP, decode."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiortc import RTCPeerConnection, RTCRtpReceiver
from aiortc.mediastreams import MediaStreamTrack
from aiortc.rtp import RtpPacket

from tests.webrtc.media import peak_hz, rms, tone
from voxserve.server.webrtc.inbound import InboundAudio
from voxserve.server.webrtc.outbound import OutboundTrack


def drop_every(receiver: RTCRtpReceiver, nth: int, dropped: list[int]) -> None:
    """Lose every nth RTP packet before the receiver sees it, as a lossy network would."""
    handle: Callable[..., Awaitable[None]] = receiver._handle_rtp_packet
    seen: list[int] = []

    async def lossy(packet: RtpPacket, arrival_time_ms: int) -> None:
        seen.append(packet.sequence_number)
        if len(seen) % nth == 0:
            dropped.append(packet.sequence_number)
            return
        await handle(packet, arrival_time_ms=arrival_time_ms)

    receiver._handle_rtp_packet = lossy  # type: ignore[method-assign]


async def call(
    seconds: float, *, lose_every: int = 0
) -> tuple[list[bytes], InboundAudio, OutboundTrack, list[int]]:
    """A 440 Hz tone of `seconds` sent on an OutboundTrack; 1.2 s of it read by InboundAudio."""
    sender, receiver = RTCPeerConnection(), RTCPeerConnection()
    outbound = OutboundTrack()
    outbound.write(tone(440, int(48_000 * seconds)).tobytes(), reply=1)
    outbound.finish(1)
    loop = asyncio.get_running_loop()
    arrived: asyncio.Future[InboundAudio] = loop.create_future()
    dropped: list[int] = []

    def on_track(track: MediaStreamTrack) -> None:  # as the call module does: before media
        rtp_receiver = receiver.getReceivers()[0]
        if lose_every:
            drop_every(rtp_receiver, lose_every, dropped)
        arrived.set_result(InboundAudio(track, receiver=rtp_receiver))

    receiver.on("track", on_track)
    sender.addTrack(outbound)
    try:
        await sender.setLocalDescription(await sender.createOffer())
        await receiver.setRemoteDescription(sender.localDescription)
        await receiver.setLocalDescription(await receiver.createAnswer())
        await sender.setRemoteDescription(receiver.localDescription)
        inbound = await asyncio.wait_for(arrived, 5)
        frames = []
        async with asyncio.timeout(5):
            while len(frames) < 60:
                frame = await inbound.read()
                assert frame is not None and len(frame) == 640
                frames.append(frame)
    finally:
        await sender.close()
        await receiver.close()
    async with asyncio.timeout(2):
        while not inbound.ended:
            await inbound.read()
    inbound.close()
    assert inbound.ended
    return frames, inbound, outbound, dropped


async def test_a_tone_crosses_a_real_peer_connection() -> None:
    frames, inbound, outbound, _ = await call(1.0)
    loud = [i for i, f in enumerate(frames) if rms(f) > 2000]
    assert 45 <= len(loud) <= 52  # the 1 s tone, give or take the codec's edges
    assert abs(peak_hz(b"".join(frames[loud[0] + 5 : loud[0] + 30]), 16_000) - 440) < 5
    assert inbound.packets_received >= 60 and inbound.packets_lost == 0
    assert outbound.played_ms(1) == 1000


async def test_ten_percent_loss_is_concealed_frame_for_frame() -> None:
    frames, inbound, _, dropped = await call(1.2, lose_every=10)
    assert inbound.jitter is not None
    lost = inbound.packets_lost
    # only what the network lost is missing (aiortc's own buffer would lose ~5 per packet)
    assert 4 <= lost <= len(dropped) and lost == inbound.jitter.skipped
    assert inbound.concealed_ms == 20 * lost
    assert abs(peak_hz(b"".join(frames[10:55]), 16_000) - 440) < 5
    loud = [i for i, f in enumerate(frames) if rms(f) > 2000]
    assert len(loud) >= 50  # concealment keeps the tone going through the holes

"""The WebRTC call's link (server/webrtc/link.py) between a real SessionDriver on the fake
engines and a real aiortc data channel (two peer connections over localhost, in process):
the Realtime events on `oai-events`, the reply audio on the outgoing track (no audio
deltas), the track's started/stopped/cleared events, a barge-in's truncation at what the
caller heard, and the way in's bounds. Most tests use stand-in tracks with the media
module's interface (exact control of what "played"); one runs the real InboundAudio and
OutboundTrack through Opus on localhost (server/webrtc/inbound.py, webrtc_outbound.py are
tested on their own in tests/webrtc/test_inbound.py, test_outbound.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from tests.fakes import FakeTts, fake_runtime, silence, tone
from tests.helpers import eventually, settings_with
from tests.webrtc.media import rms
from voxserve.config import Settings, load_settings
from voxserve.errors import ErrorCode, VoxError
from voxserve.runtime import Runtime
from voxserve.server.realtime_api.codec import RealtimeDecoder
from voxserve.server.realtime_api.session import Installed, RealtimeWire, initial_wire, installed_of
from voxserve.server.session.auth import ANONYMOUS
from voxserve.server.session.driver import SessionDriver
from voxserve.server.session.events import limit_error
from voxserve.server.webrtc.inbound import InboundAudio
from voxserve.server.webrtc.link import (
    BUFFER_HIGH,
    LABEL,
    MAX_QUEUED_MESSAGES,
    WEBRTC,
    WebRtcLink,
)
from voxserve.server.webrtc.outbound import OutboundTrack

pytestmark = pytest.mark.timeout(30)

GA = TypeAdapter(RealtimeServerEvent)
FRAME_BYTES = 640  # 20 ms of 16 kHz PCM16
TRACK_RATE = 48_000


class StandInAudio:
    """The caller's audio (InboundAudio's interface): frames the test puts, then the end."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.packets_lost = 7
        self.concealed_ms = 140

    async def read(self) -> bytes | None:
        return await self.frames.get()

    def speak(self, pcm: np.ndarray) -> None:
        data = pcm.astype(np.int16).tobytes()
        for start in range(0, len(data) - FRAME_BYTES + 1, FRAME_BYTES):
            self.frames.put_nowait(data[start : start + FRAME_BYTES])


class StandInTrack:
    """The reply's track (OutboundTrack's interface), playing in real time as written: a
    reply starts at its first write and stops once its audio has played after `finish`."""

    def __init__(self) -> None:
        self.on_started: Callable[[int], None] | None = None
        self.on_stopped: Callable[[int], None] | None = None
        self.written: dict[int, int] = {}  # reply -> bytes
        self.began: dict[int, float] = {}
        self.finished: list[int] = []
        self.cleared: list[int] = []  # ms dropped by each clear
        self.cut: set[int] = set()  # replies cleared
        self.late: list[int] = []  # writes of a reply after it was cleared
        self.told: list[int] = []  # what played_ms answered
        self._stop: asyncio.TimerHandle | None = None

    def write(self, pcm: bytes, reply: int) -> None:
        if reply not in self.began:
            self.began[reply] = time.monotonic()
            if self.on_started is not None:
                self.on_started(reply)
        self.written[reply] = self.written.get(reply, 0) + len(pcm)
        if reply in self.cut:
            self.late.append(reply)

    def _ms(self, reply: int) -> int:
        return self.written.get(reply, 0) * 1000 // (2 * TRACK_RATE)

    def _played(self, reply: int) -> int:
        began = self.began.get(reply)
        if began is None:
            return 0
        return min(self._ms(reply), int((time.monotonic() - began) * 1000))

    def played_ms(self, reply: int) -> int:
        self.told.append(played := self._played(reply))
        return played

    def finish(self, reply: int) -> None:
        self.finished.append(reply)
        left = (self._ms(reply) - self._played(reply)) / 1000
        stopped = self.on_stopped
        if stopped is not None:
            self._stop = asyncio.get_running_loop().call_later(left, stopped, reply)

    def clear(self) -> int:
        if self._stop is not None:
            self._stop.cancel()
        dropped = sum(self._ms(r) - self._played(r) for r in self.began)
        self.cleared.append(dropped)
        self.cut |= set(self.began)
        self.began.clear()
        return dropped


@dataclass
class Call:
    link: WebRtcLink
    driver: SessionDriver
    client: RTCDataChannel  # the caller's end of oai-events
    audio: StandInAudio
    track: StandInTrack
    events: list[dict[str, Any]] = field(default_factory=list)

    def send(self, kind: str, **fields: Any) -> None:
        self.client.send(json.dumps({"type": kind, **fields}))

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    async def until(self, kind: str, count: int = 1, timeout_s: float = 10.0) -> dict[str, Any]:
        await eventually(lambda: len(self.of(kind)) >= count, timeout_s)
        return self.of(kind)[count - 1]


def settings(**limits: Any) -> Settings:
    return settings_with(load_settings(log_level="warning"), limits=limits)


async def channel_pair() -> tuple[
    RTCPeerConnection, RTCPeerConnection, RTCDataChannel, RTCDataChannel
]:
    """A caller and a server peer over localhost; the caller opens oai-events."""
    caller = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    server = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    client = caller.createDataChannel(LABEL)
    arrived: asyncio.Future[RTCDataChannel] = asyncio.get_running_loop().create_future()
    server.on("datachannel", arrived.set_result)
    await caller.setLocalDescription(await caller.createOffer())
    await server.setRemoteDescription(caller.localDescription)
    await server.setLocalDescription(await server.createAnswer())
    await caller.setRemoteDescription(server.localDescription)
    channel = await asyncio.wait_for(arrived, 10)
    await eventually(lambda: client.readyState == "open" and channel.readyState == "open")
    return caller, server, client, channel


@asynccontextmanager
async def call(runtime: Runtime) -> AsyncIterator[Call]:
    """A call as webrtc_calls.py runs one: the driver started, the link run once the
    channel is open, hang_up and the driver closed at the end."""
    caller, server, client, channel = await channel_pair()
    wire, driver = track_session(runtime, model="gpt-realtime")
    audio, track = StandInAudio(), StandInTrack()
    link = WebRtcLink(driver, wire, channel, audio, track, runtime)
    c = Call(link, driver, client, audio, track)
    client.on("message", lambda text: c.events.append(json.loads(text)))
    driver.start()
    async with running(link, driver, caller, server):
        yield c


@asynccontextmanager
async def running(
    link: WebRtcLink, driver: SessionDriver, *peers: RTCPeerConnection
) -> AsyncIterator[None]:
    """`link.run()` for the block; then hang up and wait for it, close the driver (started)
    and the peers."""
    task = asyncio.get_running_loop().create_task(link.run())
    try:
        yield
    finally:
        link.hang_up()
        await asyncio.wait_for(task, 5)
        driver.close()
        await driver.wait_closed()
        for peer in peers:
            await peer.close()


def checked(events: list[dict[str, Any]]) -> None:
    """Each event as the openai SDK reads it (voxserve.* events are voxserve's own)."""
    for e in events:
        if not e["type"].startswith("voxserve."):
            GA.validate_python(e)


async def spoken_reply(c: Call, text: str) -> dict[str, Any]:
    """A user item and response.create: the echo responder says `text` back."""
    c.send(
        "conversation.item.create",
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
    )
    c.send("response.create")
    return await c.until("response.created")


def track_session(runtime: Runtime, model: str = "m") -> tuple[RealtimeWire, SessionDriver]:
    """A call's wire (media on the track) and its session driver, not started."""
    wire = initial_wire(
        installed_of(runtime.engines, runtime.settings.vad), model=model, media="track"
    )
    config = wire.config()
    return wire, SessionDriver.open(runtime, lambda: config, wire=WEBRTC, principal=ANONYMOUS)


async def test_a_reply_is_events_on_the_channel_and_audio_on_the_track() -> None:
    runtime = fake_runtime(settings())
    async with call(runtime) as c:
        await c.until("session.created")
        assert c.types()[0] == "session.created"
        created = await spoken_reply(c, "one two three")
        response_id = created["response"]["id"]
        await c.until("response.done")
        stopped = await c.until("output_audio_buffer.stopped")
        types = c.types()
        assert "response.output_audio.delta" not in types
        assert "response.output_audio.done" in types
        assert "response.output_audio_transcript.done" in types
        started = c.of("output_audio_buffer.started")
        assert [e["response_id"] for e in started] == [response_id] == [stopped["response_id"]]
        part = types.index("response.content_part.added")
        assert part < types.index("output_audio_buffer.started")
        assert types.index("output_audio_buffer.started") < types.index(
            "output_audio_buffer.stopped"
        )
        reply = next(iter(c.track.written))
        assert c.track.finished == [reply]
        # three words of the fake TTS, 0.1 s each, at the track's 48 kHz
        assert c.track.written[reply] == pytest.approx(0.3 * TRACK_RATE * 2, rel=0.05)
        checked(c.events)


async def test_the_callers_audio_reaches_the_session_and_the_counters() -> None:
    runtime = fake_runtime(settings())
    async with call(runtime) as c:
        await c.until("session.created")
        c.audio.speak(np.concatenate([silence(0.2), tone(440, 0.6), silence(1.0)]))
        done = await c.until("conversation.item.input_audio_transcription.completed")
        assert done["transcript"] == "tone440"
        await eventually(lambda: c.driver.session.received == 90)  # 1.8 s in 20 ms frames
        c.audio.frames.put_nowait(None)  # the caller's track ends: the call goes on
        c.send("input_audio_buffer.commit")
        error = await c.until("error")
        assert error["error"]["code"] == "empty_audio"
        await c.driver.end_fatally(limit_error(runtime.settings.limits, expired=True))
        ended = await c.until("voxserve.session.ended")
        assert ended["packets_lost"] == 7 and ended["concealed_ms"] == 140
        assert ended["received"] == 90 and ended["rejected"] == 0
    sample = runtime.metrics.registry.get_sample_value
    assert sample("voxserve_webrtc_packets_lost_total") == 7
    assert sample("voxserve_webrtc_concealed_seconds_total") == pytest.approx(0.14)
    assert sample("voxserve_sessions_total", {"mode": "assistant", "transport": "webrtc"}) == 1


async def test_output_audio_buffer_clear_cuts_the_track_and_truncates_the_item() -> None:
    runtime = fake_runtime(settings(), tts=FakeTts(seconds_per_word=0.3))
    async with call(runtime) as c:
        await c.until("session.created")
        created = await spoken_reply(c, " ".join(["word"] * 10))  # 3 s of audio
        await c.until("output_audio_buffer.started")
        await asyncio.sleep(0.4)
        c.send("response.cancel")
        c.send("output_audio_buffer.clear", event_id="evt_clear")
        cleared = await c.until("output_audio_buffer.cleared")
        assert cleared["response_id"] == created["response"]["id"]
        truncated = await c.until("conversation.item.truncated")
        assert truncated["item_id"] == c.of("response.output_item.added")[0]["item"]["id"]
        assert truncated["audio_end_ms"] == c.track.told[-1]  # what the track said it played
        assert 300 <= truncated["audio_end_ms"] < 3000  # some of the reply's 3 s, not all
        assert c.track.cleared and c.track.cleared[0] > 0
        assert not c.track.late
        await c.until("response.done")
        await asyncio.sleep(0.2)
        assert "output_audio_buffer.stopped" not in c.types()
        assert not c.of("error")
        checked(c.events)


async def test_a_barge_in_clears_the_track_and_truncates_at_what_was_heard() -> None:
    runtime = fake_runtime(settings(), tts=FakeTts(seconds_per_word=0.3))
    async with call(runtime) as c:
        await c.until("session.created")
        created = await spoken_reply(c, " ".join(["word"] * 10))
        await c.until("output_audio_buffer.started")
        await asyncio.sleep(0.5)
        c.audio.speak(np.concatenate([tone(440, 0.6), silence(0.8)]))  # the caller speaks
        cleared = await c.until("output_audio_buffer.cleared")
        assert cleared["response_id"] == created["response"]["id"]
        truncated = await c.until("conversation.item.truncated")
        assert truncated["item_id"] == c.of("response.output_item.added")[0]["item"]["id"]
        types = c.types()
        assert types.index("input_audio_buffer.speech_started") < types.index(
            "output_audio_buffer.cleared"
        )
        assert truncated["audio_end_ms"] == c.track.told[-1]
        assert 500 <= truncated["audio_end_ms"] < 3000
        done = await c.until("response.done")
        assert done["response"]["status"] == "cancelled"
        heard = c.of("response.output_audio_transcript.done")[0]["transcript"]
        assert 1 <= len(heard.split()) < 10  # the item says what the caller heard
        assert not c.track.late
        assert not c.of("error")
        checked(c.events)


async def test_bad_messages_are_refused_and_the_session_goes_on() -> None:
    runtime = fake_runtime(settings(max_message_bytes=4096))
    async with call(runtime) as c:
        await c.until("session.created")
        c.send("session.update", session={"type": "realtime", "instructions": "x" * 5000})
        c.client.send(b"\x00\x01")
        c.send("response.cancel", event_id="evt_cancel")
        c.send("input_audio_buffer.append", audio="AAAA", event_id="evt_append")
        await c.until("error", 4)
        codes = [e["error"]["code"] for e in c.of("error")]
        assert codes == [
            "message_too_large",
            "invalid_message",  # binary
            "response_cancel_not_active",
            "invalid_message",  # audio comes on the track
        ]
        assert c.of("error")[2]["error"]["event_id"] == "evt_cancel"
        assert c.of("error")[3]["error"]["event_id"] == "evt_append"
        assert c.driver.session.rejected == 1
        c.send("session.update", session={"type": "realtime", "instructions": "be brief"})
        updated = await c.until("session.updated")
        assert updated["session"]["instructions"] == "be brief"


async def test_a_flood_of_messages_is_bounded_and_told() -> None:
    runtime = fake_runtime(settings())
    async with call(runtime) as c:
        await c.until("session.created")
        inbox = c.link.inbox
        for _ in range(MAX_QUEUED_MESSAGES + 50):  # as the channel hands them, at once
            inbox.message(json.dumps({"type": "input_audio_buffer.clear"}))
        assert inbox.messages == MAX_QUEUED_MESSAGES
        error = await c.until("error")
        assert error["error"]["code"] == "overloaded"
        assert "50 data channel messages were dropped" in error["error"]["message"]
        await c.until("input_audio_buffer.cleared", MAX_QUEUED_MESSAGES)
        c.send("session.update", session={"type": "realtime", "instructions": "still here"})
        await c.until("session.updated")


async def test_hang_up_ends_the_session_and_run_returns() -> None:
    runtime = fake_runtime(settings())
    async with call(runtime) as c:
        await c.until("session.created")
        assert runtime.active_sessions == 1
        c.link.hang_up()
        await eventually(lambda: c.driver.attachment is None)
    assert runtime.active_sessions == 0


async def test_output_audio_buffer_clear_is_refused_on_a_websocket() -> None:
    wire = initial_wire(Installed(("fake",), "fake"), model="m")  # media "socket"
    decoder = RealtimeDecoder(wire, 4096, output_clear=lambda: [])
    with pytest.raises(VoxError, match="WebRTC and SIP only") as refused:
        decoder.decode(json.dumps({"type": "output_audio_buffer.clear"}))
    assert refused.value.code == ErrorCode.INVALID_MESSAGE


class StuckChannel:
    """A data channel whose peer reads nothing: what is sent stays buffered."""

    def __init__(self) -> None:
        self.readyState = "open"
        self.bufferedAmount = 0
        self.bufferedAmountLowThreshold = 0
        self.sent: list[str | bytes] = []

    def send(self, data: str | bytes) -> None:
        self.sent.append(data)
        self.bufferedAmount += len(data)

    def on(self, event: str, f: Callable[..., Any]) -> Any:
        return f

    def remove_listener(self, event: str, f: Callable[..., Any]) -> Any:
        return None


async def test_a_caller_that_reads_nothing_ends_as_stalled() -> None:
    runtime = fake_runtime(settings(stalled_client_s=0.3))
    wire, driver = track_session(runtime)
    channel = StuckChannel()
    link = WebRtcLink(driver, wire, channel, None, StandInTrack(), runtime)
    driver.start()
    try:
        task = asyncio.get_running_loop().create_task(link.run())
        await eventually(lambda: channel.sent)  # session.created
        channel.bufferedAmount = BUFFER_HIGH + 1  # as if much more had been sent
        link.inbox.message(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
        began = time.monotonic()
        await asyncio.wait_for(task, 5)
        assert 0.3 <= time.monotonic() - began < 2
        assert len(channel.sent) == 1  # session.updated never went out
        assert driver.session.end_reason == "client_stalled"
        labels = {"code": "client_stalled", "transport": "webrtc"}
        assert runtime.metrics.registry.get_sample_value("voxserve_errors_total", labels) == 1
    finally:
        driver.close()
        await driver.wait_closed()


async def test_a_spoken_turn_over_real_media_is_answered_on_the_track() -> None:
    """The real media ends (InboundAudio, OutboundTrack) through Opus and SRTP on localhost:
    the caller's tone is transcribed, the reply is heard on the caller's side, and the
    track's started/stopped frame it."""
    runtime = fake_runtime(settings())
    caller = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    server = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    mic, outbound = OutboundTrack(), OutboundTrack()  # the caller's microphone is a track too
    caller.addTrack(mic)
    client = caller.createDataChannel(LABEL)
    loop = asyncio.get_running_loop()
    channel_arrived: asyncio.Future[RTCDataChannel] = loop.create_future()
    caller_heard: asyncio.Future[InboundAudio] = loop.create_future()
    inbound: list[InboundAudio] = []
    server.on("datachannel", channel_arrived.set_result)
    server.on("track", lambda track: inbound.append(InboundAudio(track)))
    caller.on("track", lambda track: caller_heard.set_result(InboundAudio(track)))
    events: list[dict[str, Any]] = []
    client.on("message", lambda text: events.append(json.loads(text)))
    wire, driver = track_session(runtime)
    try:
        await caller.setLocalDescription(await caller.createOffer())
        await server.setRemoteDescription(caller.localDescription)
        server.addTrack(outbound)  # as the call does, before the answer
        await server.setLocalDescription(await server.createAnswer())
        await caller.setRemoteDescription(server.localDescription)
        channel = await asyncio.wait_for(channel_arrived, 5)
        await eventually(lambda: channel.readyState == "open" and bool(inbound))
        driver.start()
        link = WebRtcLink(driver, wire, channel, inbound[0], outbound, runtime)
        task = loop.create_task(link.run())
        mic.write(np.concatenate([tone(440, 0.6, 48_000), silence(1.0, 48_000)]).tobytes(), 1)
        mic.finish(1)
        heard = await asyncio.wait_for(caller_heard, 5)

        def types() -> list[str]:
            return [e["type"] for e in events]

        await eventually(lambda: "output_audio_buffer.stopped" in types(), 10)
        transcript = next(
            e for e in events if e["type"].endswith("input_audio_transcription.completed")
        )
        assert transcript["transcript"] == "tone440"
        assert "response.output_audio.delta" not in types()
        assert types().index("output_audio_buffer.started") < types().index(
            "output_audio_buffer.stopped"
        )
        reply = [e for e in events if e["type"] == "response.output_audio.done"]
        assert len(reply) == 1
        loudest = 0.0  # of what the caller received, up to 3 s: the reply's tone is in it
        for _ in range(150):
            frame = await asyncio.wait_for(heard.read(), 2)
            assert frame is not None
            loudest = max(loudest, rms(frame))
            if loudest > 2000:
                break
        assert loudest > 2000
        assert outbound.played_ms(1) >= 90  # one word of the fake TTS: 100 ms
        link.hang_up()
        await asyncio.wait_for(task, 5)
    finally:
        driver.close()
        await driver.wait_closed()
        await caller.close()
        await server.close()


async def test_messages_sent_as_the_channel_opens_are_not_lost() -> None:
    """A client may send at once in `onopen`: what came before the link is handed to it
    (`pending`), what comes before run() is queued; session.created still comes first."""
    runtime = fake_runtime(settings())
    caller, server, client, channel = await channel_pair()
    early: list[str | bytes] = []
    channel.on("message", early.append)  # the call's listener until the link exists
    events: list[dict[str, Any]] = []
    client.on("message", lambda text: events.append(json.loads(text)))

    def update(instructions: str) -> None:
        session = {"type": "realtime", "instructions": instructions}
        client.send(json.dumps({"type": "session.update", "session": session}))

    update("first")
    await eventually(lambda: early)
    channel.remove_listener("message", early.append)
    wire, driver = track_session(runtime)
    driver.start()
    link = WebRtcLink(driver, wire, channel, None, StandInTrack(), runtime, pending=early)
    update("second")
    await asyncio.sleep(0.1)  # arrives before run()
    async with running(link, driver, caller, server):
        await eventually(lambda: len([e for e in events if e["type"] == "session.updated"]) == 2)
        assert events[0]["type"] == "session.created"
        said = [e["session"]["instructions"] for e in events if e["type"] == "session.updated"]
        assert said == ["first", "second"]


async def test_messages_the_call_could_not_hold_are_told() -> None:
    """What the call dropped before the link existed (past its bound of held messages) is
    told as the link's own drops: one `error` naming how many, never silence."""
    runtime = fake_runtime(settings())
    caller, server, client, channel = await channel_pair()
    events: list[dict[str, Any]] = []
    client.on("message", lambda text: events.append(json.loads(text)))
    wire, driver = track_session(runtime)
    driver.start()
    held = [json.dumps({"type": "input_audio_buffer.clear"})] * 3
    link = WebRtcLink(driver, wire, channel, None, StandInTrack(), runtime, pending=held, dropped=6)
    async with running(link, driver, caller, server):
        await eventually(lambda: any(e["type"] == "error" for e in events))
        error = next(e for e in events if e["type"] == "error")
        assert error["error"]["code"] == "overloaded"
        assert "6 data channel messages were dropped" in error["error"]["message"]
        await eventually(
            lambda: len([e for e in events if e["type"] == "input_audio_buffer.cleared"]) == 3
        )

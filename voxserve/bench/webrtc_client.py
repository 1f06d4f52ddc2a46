"""A WebRTC caller (aiortc), as a browser or a phone calls `POST /v1/realtime/calls`: for the
end-to-end tests and for `voxserve bench ... --mode webrtc`.

It offers one sendrecv audio track (`PacedAudio`: PCM16 mono 48 kHz frames handed to the
Opus encoder by the monotonic clock, 20 ms each, silence once the source has nothing) and the
`oai-events` data channel; POSTs the offer (`application/sdp`, or multipart with a session
object) with a bearer key; applies the answer; records every data channel event with its
arrival time, and the reply audio of the remote track (the first sound of each response by
arrival time; the PCM itself when asked). The network is simulated on our side only:
`loss` drops a seeded random share of our outgoing audio RTP packets (RTCP and the data
channel untouched), `vanish()` stops every packet without a BYE, a DTLS close or an SCTP
abort, as a phone that lost its network; `hang_up()` is the polite end (DELETE Location).

aiortc is the `webrtc` extra: it is imported here only, and this module only by the
bench's and the tests' WebRTC code paths.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import random
import ssl
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
from aiortc import (
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCRtpTransceiver,
    RTCSessionDescription,
)
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtp import is_rtcp
from av import AudioFrame

RATE = 48_000  # Opus on the wire; what both tracks carry here
FRAME_S = 0.020
FRAME_SAMPLES = 960
FRAME_BYTES = FRAME_SAMPLES * 2
TIME_BASE = Fraction(1, RATE)
SOUND_RMS = 100.0  # a received frame above this RMS (about -50 dBFS) is reply sound
GAP_FRAMES = 3  # silent frames that end a run of sound (a new run is a new reply's start)
CHANNEL = "oai-events"

Event = dict[str, Any]
FrameSource = Callable[[int], bytes | None]  # frame k -> 1920 bytes, or None: silence


def to_48k(pcm: npt.NDArray[np.int16], rate: int) -> bytes:
    """PCM16 mono at `rate` -> 48 kHz, padded to whole 20 ms frames."""
    from voxserve.audio.resample import resample

    out = resample(pcm.astype(np.int16), rate, RATE) if rate != RATE else pcm.astype(np.int16)
    out = np.concatenate([out, np.zeros(-out.size % FRAME_SAMPLES, dtype=np.int16)])
    return out.astype("<i2").tobytes()


def clip_source(pcm48: bytes) -> FrameSource:
    """Frames of one recording, then silence."""
    frames = len(pcm48) // FRAME_BYTES

    def frame(k: int) -> bytes | None:
        return pcm48[k * FRAME_BYTES : (k + 1) * FRAME_BYTES] if k < frames else None

    return frame


class PacedAudio(MediaStreamTrack):
    """The caller's microphone: frame k is handed to the encoder at start + k * 20 ms by the
    monotonic clock (aiortc's sender pulls recv() in a loop, encodes in a thread and sends),
    so the wire sees real time. How late each frame was handed over goes to `lateness`."""

    kind = "audio"

    def __init__(self, source: FrameSource, lateness: array[float] | None = None) -> None:
        super().__init__()
        self.source = source
        self.lateness = lateness if lateness is not None else array("d")
        self.sent = 0
        self.start: float | None = None
        self.silence = bytes(FRAME_BYTES)

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        k = self.sent
        if self.start is None:
            self.start = time.monotonic()
        due = self.start + k * FRAME_S
        if (delay := due - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        self.lateness.append(time.monotonic() - due)
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(self.source(k) or self.silence)
        frame.sample_rate = RATE
        frame.time_base = TIME_BASE
        frame.pts = k * FRAME_SAMPLES
        self.sent += 1
        return frame


@dataclass
class Loss:
    """Drops a seeded random share of outgoing audio RTP packets (the simulated network)."""

    rate: float
    seed: int = 0
    sent: int = 0
    dropped: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate < 1.0:
            raise ValueError(f"loss must be in [0, 1), not {self.rate}")
        self.rng = random.Random(self.seed)

    def drop(self) -> bool:
        self.sent += 1
        if self.rate and self.rng.random() < self.rate:
            self.dropped += 1
            return True
        return False


@dataclass
class Heard:
    """The remote track as a listener hears it."""

    frames: int = 0
    sound_frames: int = 0
    run_starts: list[float] = field(default_factory=list)  # first frame of each run of sound
    run_frames: list[int] = field(default_factory=list)  # ... and its index among the frames
    pcm: bytearray | None = None  # 48 kHz PCM16 mono, when kept
    quiet: int = GAP_FRAMES  # silent frames since the last sound


class CallError(RuntimeError):
    """POST /v1/realtime/calls did not answer 201 (status and body kept)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"call refused: HTTP {status}: {body[:200]}")
        self.status = status
        self.body = body


class WebRtcCaller:
    """One call. Use `await caller.call(base_url, key)`, then `send`/`wait_for`, then
    `hang_up()` or `vanish()`, and always `close()`."""

    def __init__(
        self,
        source: FrameSource,
        *,
        loss: float = 0.0,
        seed: int = 0,
        keep_audio: bool = False,
        on_frame: Callable[[int, float], None] | None = None,
        lateness: array[float] | None = None,
        on_event: Callable[[Event, float], None] | None = None,
        on_sound: Callable[[float], None] | None = None,
    ) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # host candidates only
        self.track = PacedAudio(source, lateness)
        self.on_frame = on_frame
        self.wire_lateness = array("d")  # frame due -> its RTP packet leaving
        self._rtp_origin: int | None = None
        self.transceiver: RTCRtpTransceiver = self.pc.addTransceiver(self.track, "sendrecv")
        self.channel: RTCDataChannel = self.pc.createDataChannel(CHANNEL)
        self.loss = Loss(loss, seed)
        self.heard = Heard(pcm=bytearray() if keep_audio else None)
        self.events: list[tuple[float, Event]] = []
        self.on_event = on_event
        self.on_sound = on_sound
        self.location: str | None = None
        self.base_url = ""
        self.headers: dict[str, str] = {}
        self.vanished = False
        self._opened = asyncio.Event()
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self.channel.on("open", self._opened.set)
        self.channel.on("message", self._message)
        self.pc.on("track", self._track)

    # --- setting up -----------------------------------------------------------------------

    async def offer(self) -> str:
        """The offer SDP, with our host candidates gathered (aiortc gathers here)."""
        await self.pc.setLocalDescription(await self.pc.createOffer())
        self._wrap_rtp()
        return self.pc.localDescription.sdp

    async def answer(self, sdp: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp, "answer"))

    async def call(
        self,
        base_url: str,
        api_key: str | None,
        *,
        session: dict[str, Any] | None = None,
        timeout_s: float = 15.0,
    ) -> None:
        """Offer, POST it (raw SDP; multipart with `session` as the SDK sends it), apply the
        answer and wait until the data channel is open. Raises CallError on a refusal."""
        offer = await self.offer()
        self._target(base_url, api_key)
        url = f"{self.base_url}/v1/realtime/calls"
        async with _http(timeout_s) as client:
            if session is None:
                headers = {**self.headers, "Content-Type": "application/sdp"}
                resp = await client.post(url, content=offer.encode(), headers=headers)
            else:
                files = {
                    "sdp": (None, offer.encode(), "application/sdp"),
                    "session": (None, json.dumps(session).encode(), "application/json"),
                }
                resp = await client.post(url, files=files, headers=self.headers)
        if resp.status_code != 201:
            raise CallError(resp.status_code, resp.text)
        await self.attach(resp.text, resp.headers.get("location"), base_url, api_key, timeout_s)

    async def attach(
        self,
        answer: str,
        location: str | None,
        base_url: str,
        api_key: str | None,
        timeout_s: float = 15.0,
    ) -> None:
        """Complete a call whose offer was POSTed by someone else (the `openai` SDK's
        `realtime.calls.create`): apply the answer, wait for the data channel."""
        self._target(base_url, api_key)
        self.location = location
        await self.answer(answer)
        await self.opened(timeout_s)

    def _target(self, base_url: str, api_key: str | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def opened(self, timeout_s: float = 15.0) -> None:
        async with asyncio.timeout(timeout_s):
            await self._opened.wait()

    @property
    def call_id(self) -> str | None:
        return self.location.rsplit("/", 1)[-1] if self.location else None

    def _wrap_rtp(self) -> None:
        """Our audio RTP is timed as it leaves (`_on_wire`) and passes through `loss` (none
        once vanished); RTCP is not touched."""
        dtls = self.transceiver.sender.transport
        send = dtls._send_rtp

        async def send_rtp(data: bytes) -> None:
            if self.vanished:
                return
            if not is_rtcp(data):
                self._on_wire(data)
                if self.loss.drop():
                    return
            await send(data)

        dtls._send_rtp = send_rtp  # type: ignore[method-assign]

    def _on_wire(self, packet: bytes) -> None:
        """Frame k of our track left now (its RTP timestamp says which: 960 a frame): told
        to `on_frame`, and how late against start + k * 20 ms (encoding included)."""
        now = time.monotonic()
        stamp = int.from_bytes(packet[4:8], "big")
        if self._rtp_origin is None:
            self._rtp_origin = stamp
        k = ((stamp - self._rtp_origin) & 0xFFFFFFFF) // FRAME_SAMPLES
        start = self.track.start if self.track.start is not None else now
        self.wire_lateness.append(now - (start + k * FRAME_S))
        if self.on_frame is not None:
            self.on_frame(k, now)

    # --- what comes back ------------------------------------------------------------------

    def _message(self, message: str | bytes) -> None:
        now = time.monotonic()
        try:
            event = json.loads(message)
        except ValueError:
            event = {"type": "bad_json"}
        if not isinstance(event, dict):
            event = {"type": "bad_json"}
        self.events.append((now, event))
        if self.on_event is not None:
            self.on_event(event, now)
        self._notify()

    def _notify(self) -> None:
        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        self._tasks.append(asyncio.ensure_future(notify()))
        self._tasks = [t for t in self._tasks if not t.done()]

    def _track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            for transceiver in self.pc.getTransceivers():
                if transceiver.receiver.track is track:
                    _prompt_listener(transceiver.receiver)
            self._tasks.append(asyncio.ensure_future(self._listen(track)))

    async def _listen(self, track: MediaStreamTrack) -> None:
        heard = self.heard
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                now = time.monotonic()
                if not isinstance(frame, AudioFrame):
                    continue
                pcm = _mono(frame)
                index = heard.frames
                heard.frames += 1
                if heard.pcm is not None:
                    heard.pcm += pcm.tobytes()
                level = float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if pcm.size else 0.0
                if level < SOUND_RMS:
                    heard.quiet += 1
                    continue
                heard.sound_frames += 1
                if heard.quiet >= GAP_FRAMES:
                    heard.run_starts.append(now)
                    heard.run_frames.append(index)
                    if self.on_sound is not None:
                        self.on_sound(now)
                    self._notify()
                heard.quiet = 0

    def of(self, kind: str) -> list[Event]:
        return [e for _, e in self.events if e.get("type") == kind]

    def at(self, kind: str) -> list[float]:
        """Arrival times of the events of `kind`."""
        return [t for t, e in self.events if e.get("type") == kind]

    async def wait_for(
        self, kind: str, where: Callable[[Event], bool] = lambda e: True, timeout_s: float = 30.0
    ) -> Event:
        """The first event of `kind` (and `where`), received already or later."""
        event: Event = await self.until(
            lambda: next((e for e in self.of(kind) if where(e)), None), timeout_s
        )
        return event

    async def until(self, check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
        """Wait until `check()` (re-evaluated on every event and run of sound) is truthy."""
        async with asyncio.timeout(timeout_s):
            async with self._changed:
                while not (value := check()):
                    await self._changed.wait()
                return value

    def first_sound_after(self, t: float) -> float | None:
        return next((s for s in self.heard.run_starts if s >= t), None)

    def responses(self) -> list[tuple[str, float, float | None]]:
        """(response id, response.created arrival, first sound heard after it and before
        the next response's creation)."""
        created = [(t, str(e["response"]["id"])) for t, e in self.events if _created(e)]
        out = []
        for i, (t, rid) in enumerate(created):
            end = created[i + 1][0] if i + 1 < len(created) else float("inf")
            first = self.first_sound_after(t)
            out.append((rid, t, first if first is not None and first < end else None))
        return out

    # --- sending --------------------------------------------------------------------------

    async def send(self, event: Event) -> None:
        await self.opened()
        self.channel.send(json.dumps(event))

    # --- ending ---------------------------------------------------------------------------

    async def hang_up(self, timeout_s: float = 10.0) -> int:
        """DELETE the call's Location (the polite end); returns the HTTP status."""
        if self.location is None:
            raise RuntimeError("no call to hang up")
        async with _http(timeout_s) as client:
            resp = await client.delete(self._absolute(self.location), headers=self.headers)
        return resp.status_code

    def _absolute(self, location: str) -> str:
        return location if "://" in location else f"{self.base_url}{location}"

    def vanish(self) -> None:
        """Gone without a word: no more RTP, RTCP, SCTP, DTLS or STUN (consent answers
        included) leave this peer, and its UDP sockets are closed."""
        self.vanished = True
        self.track.stop()
        for ice in _ice_transports(self.pc):
            ice._send = _nothing  # type: ignore[method-assign]  # DTLS, SCTP, RTP, RTCP
            connection = ice._connection
            task = connection._query_consent_task
            if task is not None:
                task.cancel()
            for protocol in list(connection._protocols):
                transport = getattr(protocol, "transport", None)
                if transport is not None:
                    transport.close()

    async def close(self) -> None:
        """Free this peer (after a vanish nothing of it reaches the wire)."""
        with contextlib.suppress(Exception):
            await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs what is submitted at once, in the caller's thread. aiortc encodes every 20 ms
    frame through the loop's default executor: with many callers in one load process the
    thread hop (and the GIL going back and forth) made frames leave tens of ms late on a
    busy machine, for an encode of ~0.1 ms. A load process sets it as its loop's default
    (asyncio wants a ThreadPoolExecutor there: this one never starts a thread)."""

    def submit(  # type: ignore[override]
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting side
            future.set_exception(exc)
        return future


_TLS: list[ssl.SSLContext] = []


def warm() -> None:
    """Make the process's TLS context now (a load process, before its clock starts)."""
    if not _TLS:
        _TLS.append(ssl.create_default_context())


def _http(timeout_s: float) -> httpx.AsyncClient:
    """An HTTP client on the process's one TLS context: httpx loads the CA bundle for every
    new client otherwise (~0.2-0.5 s on a busy machine, in the event loop, every call)."""
    warm()
    return httpx.AsyncClient(timeout=timeout_s, verify=_TLS[0])


async def _nothing(data: bytes) -> None:
    return None


def _created(event: Event) -> bool:
    return event.get("type") == "response.created" and isinstance(event.get("response"), dict)


def _ice_transports(pc: RTCPeerConnection) -> list[Any]:
    seen: list[Any] = []
    for transceiver in pc.getTransceivers():
        dtls = transceiver.sender.transport
        if dtls is not None and dtls.transport not in seen:
            seen.append(dtls.transport)
    sctp = pc.sctp
    if sctp is not None and sctp.transport.transport not in seen:
        seen.append(sctp.transport.transport)
    return seen


def _prompt_listener(receiver: Any) -> None:
    """Hear each frame as soon as it is complete (the next packet is in): aiortc's audio
    receiver holds 4 frames (prefetch) first, 80 ms no browser on a clean network waits,
    which would count in the reply's first audio. Set before the first packet arrives."""
    name = "_RTCRtpReceiver__jitter_buffer"
    if hasattr(receiver, name):
        setattr(receiver, name, JitterBuffer(capacity=16, prefetch=0))


def _mono(frame: AudioFrame) -> npt.NDArray[np.int16]:
    """A decoded frame (s16, packed; aiortc's Opus decoder gives stereo) as mono PCM16."""
    data = frame.to_ndarray().reshape(-1)
    channels = len(frame.layout.channels)
    if channels > 1:
        data = data.reshape(-1, channels).mean(axis=1)
    return data.astype(np.int16)

"""The Realtime stream: one OpenAI Realtime API session over a plain WebSocket, played at
real-time pace, as a voice agent (the Agents SDK, LiveKit, pipecat) would drive it.

It speaks the published protocol only: connect to `/v1/realtime?model=...` (bearer key in
the Authorization header), wait for `session.created`, send `session.update` (audio/pcm
24 kHz in and out, server VAD, input transcription) and wait for `session.updated`, then
`input_audio_buffer.append` the stream's script as base64 PCM16 at 24 kHz, 20 ms (or 40 ms)
pieces by the wall clock. The server's events are timed by `RealtimeTurns`. Realtime has no
end-of-input message: after the run's end the stream sends silence for the VAD hangover +
0.3 s (as the /v1/stream client does before `audio.end`), waits until its last turn is
answered (bounded by the drain) and closes with 1000.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from voxserve.bench.audio_client import TAIL_S  # silence after the hangover, the same
from voxserve.bench.program import Program, Script, frame_bytes, pcm_at
from voxserve.bench.realtime_turns import RealtimeTurns, error_code
from voxserve.bench.records import Raw
from voxserve.bench.schedule import FRAME_S, FrameClock
from voxserve.bench.wsbase import RecordedStream, paced

RATE = 24_000  # audio/pcm is 24 kHz in the Realtime API, in and out
HANDSHAKE_S = 10.0
APPEND = '{"type":"input_audio_buffer.append","audio":"%s"}'
_B64: dict[int, tuple[Program, list[str]]] = {}


def frames_b64(program: Program) -> list[str]:
    """Each 20 ms frame of the program at 24 kHz, base64: a 960-byte frame is a whole number
    of base64 quanta, so a piece's base64 is its frames' strings joined. Once per process."""
    if id(program) not in _B64:
        pcm, size = pcm_at(program, RATE), frame_bytes(RATE)
        frames = [
            base64.b64encode(pcm[p * size : (p + 1) * size]).decode() for p in range(program.frames)
        ]
        _B64[id(program)] = (program, frames)
    return _B64[id(program)][1]


def session_update(transcription_model: str, voice: str | None) -> dict[str, Any]:
    """GA `session.update`: audio in and out, server VAD with the server's own settings
    (no threshold or silence given, so the VAD is configured as /v1/stream's)."""
    output: dict[str, Any] = {"format": {"type": "audio/pcm", "rate": RATE}}
    if voice:
        output["voice"] = voice
    return {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "output_modalities": ["audio"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": RATE},
                    "turn_detection": {"type": "server_vad"},
                    "transcription": {"model": transcription_model},
                },
                "output": output,
            },
        },
    }


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """What a Realtime session and a WebRTC call are both given: the stream's script, the
    instant (time.monotonic()) its audio stops for the tail of silence, the drain, the key
    and the session's settings."""

    script: Script
    end_at: float
    drain_s: float
    hangover_s: float = 0.5
    lateness: array[float] = field(default_factory=lambda: array("d"))  # each frame's, s
    api_key: str | None = None
    transcription_model: str = "whisper-1"
    voice: str | None = None

    def session_update(self) -> dict[str, Any]:
        return session_update(self.transcription_model, self.voice)

    def audio_frames(self, clock: FrameClock) -> tuple[int, int]:
        """(frames of script, and with the tail of silence) of a stream on `clock`."""
        frames = self.script.whole(clock.frames_before(self.end_at))
        return frames, frames + math.ceil((self.hangover_s + TAIL_S) / FRAME_S)


class RealtimeStream(RecordedStream):
    """One session. `run()` never raises: every failure ends up in `raw.errors`."""

    def __init__(self, url: str, raw: Raw, plan: StreamPlan, *, piece_ms: int = 20) -> None:
        if piece_ms % 20 or piece_ms <= 0:
            raise ValueError(f"piece_ms must be a multiple of 20, not {piece_ms}")
        super().__init__(raw)
        self.url = url
        self.plan = plan
        self.headers = {"Authorization": f"Bearer {plan.api_key}"} if plan.api_key else None
        self.piece_frames = piece_ms // 20
        self.turns = RealtimeTurns(raw, plan.script, hangover_s=plan.hangover_s, output_rate=RATE)
        self.closing = False
        self.produced = False
        self.settled = asyncio.Event()

    def _refused(self, exc: InvalidStatus) -> None:
        """Refused at the handshake (auth, overload): counted, by its HTTP status."""
        self.raw.counts["refused"] += 1
        self.error(f"connect:http_{exc.response.status_code}")

    def finish(self) -> None:
        self.turns.finish()

    async def _run(self) -> None:
        began = time.monotonic()
        async with connect(
            self.url,
            additional_headers=self.headers,
            compression=None,
            open_timeout=HANDSHAKE_S,
            ping_interval=None,
            max_size=None,
        ) as ws:
            if not await self._handshake(ws, began):
                return
            receiver = asyncio.create_task(self._receive(ws))
            try:
                await self.produce(ws)
                self.produced = True
                self._check_settled()
                settled = asyncio.create_task(self.settled.wait())
                await asyncio.wait(
                    {receiver, settled},
                    timeout=self.plan.drain_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                settled.cancel()
                await asyncio.gather(settled, return_exceptions=True)
                if receiver.done():
                    self._ended(receiver)
                    return
                if not self.settled.is_set():
                    self._drain_timeout()
                self.closing = True
                with contextlib.suppress(ConnectionClosed):
                    await ws.close()
            finally:
                receiver.cancel()
                await asyncio.gather(receiver, return_exceptions=True)

    def _ended(self, receiver: asyncio.Task[None]) -> None:
        """The server closed the session before the client did: always an error here."""
        exc = receiver.exception()
        if isinstance(exc, ConnectionClosed):
            self._closed(exc)
        elif exc is not None:
            self.error(f"receive:{type(exc).__name__}")
        else:
            self.error("closed_by_server")

    async def _handshake(self, ws: ClientConnection, began: float) -> bool:
        """session.created, then session.update until session.updated: ready to stream."""
        async with asyncio.timeout(HANDSHAKE_S):
            first = json.loads(await ws.recv())
            if first.get("type") != "session.created":
                self.raw.add("refusal", time.monotonic() - began)
                self.raw.counts["refused"] += 1
                self.error(error_code(first.get("error"), str(first.get("type"))))
                return False
            await ws.send(json.dumps(self.plan.session_update()))
            while (event := json.loads(await ws.recv())).get("type") != "session.updated":
                if event.get("type") == "error":
                    self.error("session.update:" + error_code(event.get("error"), "error"))
                    return False
        self.raw.add("connect", time.monotonic() - began)
        self.raw.counts["sessions"] += 1
        return True

    async def produce(self, ws: ClientConnection) -> None:
        """The script until end_at, then the tail of silence, in pieces of piece_frames
        frames, each sent when its last frame is complete (frame k is due at base + 20k)."""
        script = self.plan.script
        b64 = frames_b64(script.program)
        silent = base64.b64encode(bytes(frame_bytes(RATE))).decode()
        clock = FrameClock(time.monotonic())
        frames, with_tail = self.plan.audio_frames(clock)
        total = math.ceil(with_tail / self.piece_frames) * self.piece_frames
        piece: list[str] = []
        firsts: list[int] = []
        lasts: list[int] = []
        for k in range(total):
            if k < frames:
                piece.append(b64[script.position(k)])
                if (u := script.speech_first(k)) is not None:
                    firsts.append(u)
                if (u := script.speech_last(k)) is not None:
                    lasts.append(u)
            else:
                piece.append(silent)
            if len(piece) < self.piece_frames:
                continue
            now = await paced(clock, k, self.plan.lateness)
            await ws.send(APPEND % "".join(piece))
            for u in firsts:
                self.turns.first_sent[u] = now
            for u in lasts:
                self.turns.last_sent[u] = now
            piece.clear()
            firsts.clear()
            lasts.clear()
        self.raw.counts["frames_sent"] += total

    async def _receive(self, ws: ClientConnection) -> None:
        async for message in ws:
            now = time.monotonic()
            if isinstance(message, bytes):
                self.raw.counts["binary_messages"] += 1  # Realtime sends JSON text only
                continue
            try:
                event = json.loads(message)
            except ValueError:
                event = None
            if not isinstance(event, dict):
                self.raw.errors["bad_json"] += 1
                continue
            self.turns.on_event(event, now)
            self._check_settled()

    def _check_settled(self) -> None:
        if self.produced and self.turns.idle():
            self.settled.set()

    def _drain_timeout(self) -> None:
        """In flight at the drain's end: a response or a committed turn is an error; only
        the last utterance not heard (the VAD never started on it) is counted, not failed."""
        turns = self.turns
        if turns.open or turns.committed is not None or turns.speaking is not None:
            self.error("drain_timeout")
        else:
            self.raw.counts["utterances_unheard"] += 1

    def _closed(self, exc: ConnectionClosed) -> None:
        code = exc.rcvd.code if exc.rcvd is not None else 1006
        if not (self.closing and code == 1000):
            self.error(f"close_{code}")

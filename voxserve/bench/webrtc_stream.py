"""The WebRTC stream: one call (`WebRtcCaller`) playing a stream's script at real time on its
audio track, as a browser or a phone would, with the figures of the Realtime client.

It POSTs its offer to `/v1/realtime/calls` (bearer key), waits for the `oai-events` channel
and `session.created`, sends the same GA `session.update` as the Realtime WebSocket client
(server VAD with the server's settings, input transcription, audio out; no audio format: the
track is Opus) and waits for `session.updated`; then the track plays the script (16 kHz
program resampled once to 48 kHz) until the run's end, then silence for the hangover + 0.3 s,
waits until its last turn is answered (bounded by the drain) and hangs up (DELETE).

The data channel carries the Realtime server events, timed by `RealtimeTurns` as on
/v1/realtime (vad_end, ttfp, final). There is no audio delta: a reply's first audio is the
first run of sound (RMS over -50 dBFS after 60 ms of quiet) heard on the remote track after
its `response.created`, and `turn` runs from the instant our track handed the utterance's
last speech frame to the encoder to that arrival: what a listener hears, Opus, SRTP, the
server's pacing and the loopback included.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Any

import httpx

from voxserve.bench.program import Script, pcm_at
from voxserve.bench.realtime_client import StreamPlan
from voxserve.bench.realtime_turns import RealtimeTurns, error_code
from voxserve.bench.records import Raw
from voxserve.bench.schedule import FRAME_S, FrameClock

HANDSHAKE_S = 15.0
RATE = 48_000
FRAME_BYTES = RATE // 50 * 2


class WebRtcTurns(RealtimeTurns):
    """Realtime events from the data channel; a reply's first audio is its first sound on
    the track (responses are heard in the order they were created)."""

    def __init__(self, raw: Raw, script: Script, *, hangover_s: float) -> None:
        super().__init__(raw, script, hangover_s=hangover_s, output_rate=RATE)
        self.unheard: deque[int] = deque()  # replies created, no sound heard yet

    def on_event(self, event: dict[str, Any], now: float) -> None:
        super().on_event(event, now)
        kind = event.get("type")
        response = event.get("response") or {}
        if kind == "response.created":
            self.unheard.append(self.responses[str(response.get("id"))])
        elif kind == "response.done" and response.get("status") in ("cancelled", "failed"):
            reply = self.responses.get(str(response.get("id")))
            with contextlib.suppress(ValueError):
                self.unheard.remove(reply)  # type: ignore[arg-type]

    def on_sound(self, now: float) -> None:
        if self.unheard:
            self._first_audio(self.unheard.popleft(), now)
            self.raw.counts["replies_heard"] += 1
        else:
            self.raw.counts["sound_outside_reply"] += 1

    def idle(self) -> bool:
        return super().idle() and not self.unheard


class WebRtcStream:
    """One call. `run()` never raises: every failure ends up in `raw.errors`."""

    def __init__(
        self, base_url: str, raw: Raw, plan: StreamPlan, *, loss: float = 0.0, seed: int = 0
    ) -> None:
        self.base_url = base_url
        self.raw = raw
        self.plan = plan
        self.update = plan.session_update()
        self.update["session"]["audio"]["input"].pop("format")  # the track is the format
        self.update["session"]["audio"]["output"].pop("format")
        self.loss = loss
        self.seed = seed
        self.turns = WebRtcTurns(raw, plan.script, hangover_s=plan.hangover_s)
        self.failed = False
        self.limit: int | None = None  # frames of script, set at the first frame
        self.total: int | None = None  # and with the tail of silence
        self.produced = asyncio.Event()
        self.settled = asyncio.Event()
        self.pcm = pcm_at(plan.script.program, RATE)  # resampled once per process

    def error(self, code: str) -> None:
        self.raw.errors[code] += 1
        self.failed = True

    async def run(self) -> None:
        from voxserve.bench.webrtc_client import CallError, WebRtcCaller

        caller = WebRtcCaller(
            self._frame,
            loss=self.loss,
            seed=self.seed,
            on_frame=self._sent,
            lateness=self.plan.lateness,
            on_event=self._event,
            on_sound=self._sound,
        )
        try:
            await self._run(caller)
        except CallError as exc:
            self.raw.counts["refused"] += 1
            self.error(f"connect:http_{exc.status}")
        except (OSError, httpx.HTTPError) as exc:
            self.error(f"connect:{type(exc).__name__}")
        except TimeoutError:
            self.error("timeout")
        finally:
            self.raw.counts["packets_sent"] += caller.loss.sent
            self.raw.counts["packets_dropped"] += caller.loss.dropped
            self.raw.counts["audio_ms"] += caller.heard.sound_frames * 20  # reply sound heard
            self.raw.samples.setdefault("rtp_send_lag", []).extend(caller.wire_lateness)
            await caller.close()
        if self.failed:
            self.raw.failed_streams += 1
        self.turns.finish()

    async def _run(self, caller: Any) -> None:
        began = time.monotonic()
        await caller.call(self.base_url, self.plan.api_key, timeout_s=HANDSHAKE_S)
        await caller.wait_for("session.created", timeout_s=HANDSHAKE_S)
        await caller.send(self.update)
        updated = await caller.until(
            lambda: caller.of("session.updated") or caller.of("error"), timeout_s=HANDSHAKE_S
        )
        if updated[0].get("type") == "error":
            self.error("session.update:" + error_code(updated[0].get("error"), "error"))
            return
        self.raw.add("connect", time.monotonic() - began)
        self.raw.counts["sessions"] += 1
        await self.produced.wait()
        self._check_settled()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.plan.drain_s):
                await self.settled.wait()
        if not self.settled.is_set():
            self._drain_timeout()
        status = await caller.hang_up()
        if status not in (200, 204):
            self.error(f"hangup:http_{status}")
        # The session's own end, with the call's media counters (best effort).
        with contextlib.suppress(TimeoutError):
            ended = await caller.wait_for("voxserve.session.ended", timeout_s=2.0)
            for key in ("packets_lost", "concealed_ms"):
                if isinstance(value := ended.get(key), int):
                    self.raw.counts[f"server_{key}"] += value

    def _frame(self, k: int) -> bytes | None:
        """Frame k of the track: the script until end_at, then silence (None)."""
        if self.limit is None:
            clock = FrameClock(time.monotonic() - k * FRAME_S)
            self.limit, self.total = self.plan.audio_frames(clock)
        if k >= self.limit:
            return None
        p = self.plan.script.position(k)
        return self.pcm[p * FRAME_BYTES : (p + 1) * FRAME_BYTES]

    def _sent(self, k: int, now: float) -> None:
        if self.limit is not None and k < self.limit:
            if (u := self.plan.script.speech_first(k)) is not None:
                self.turns.first_sent[u] = now
            if (u := self.plan.script.speech_last(k)) is not None:
                self.turns.last_sent[u] = now
        self.raw.counts["frames_sent"] += 1
        if self.total is not None and k + 1 >= self.total and not self.produced.is_set():
            self.produced.set()

    def _event(self, event: dict[str, Any], now: float) -> None:
        self.turns.on_event(event, now)
        self._check_settled()

    def _sound(self, now: float) -> None:
        self.turns.on_sound(now)
        self._check_settled()

    def _check_settled(self) -> None:
        if self.produced.is_set() and self.turns.idle():
            self.settled.set()

    def _drain_timeout(self) -> None:
        turns = self.turns
        if turns.open or turns.committed is not None or turns.speaking is not None:
            self.error("drain_timeout")
        elif turns.unheard:
            self.error("reply_not_heard")
        else:
            self.raw.counts["utterances_unheard"] += 1

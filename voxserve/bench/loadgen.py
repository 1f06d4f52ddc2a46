"""One load process: the streams of a step that this process drives, on one event loop.

It measures itself while it drives the load: how late each frame went out against its
schedule, how late its event loop wakes (a 10 ms ticker), and its own CPU over the steady
window, so a step where the load generator was the bottleneck can be refused.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from voxserve.bench.audio_client import AudioStream
from voxserve.bench.program import Program, pcm_at, scripts
from voxserve.bench.realtime_client import RealtimeStream, StreamPlan, frames_b64
from voxserve.bench.records import Raw
from voxserve.bench.schedule import start_offsets
from voxserve.bench.servers import http_base, realtime_url
from voxserve.bench.stats import percentile
from voxserve.bench.text_client import TextStream
from voxserve.bench.wsbase import WsStream
from voxserve.types import SAMPLE_RATE

if TYPE_CHECKING:
    from voxserve.bench.webrtc_stream import WebRtcStream

TICK_S = 0.010


@dataclass(frozen=True)
class StepSpec:
    """Everything a load process needs to run its share of a step (pickled to workers)."""

    url: str  # ws://HOST:PORT/v1/stream (realtime: its /v1/realtime is derived)
    mode: str  # asr | assistant | tts | realtime (an OpenAI Realtime client) | webrtc (a call)
    streams: int
    duration_s: float
    ramp_s: float
    program: Program | None = None
    texts: tuple[str, ...] = ()
    session: dict[str, Any] = field(default_factory=dict)  # extra session.start fields
    mark_every_s: float = 0.5
    hangover_s: float = 0.5
    drain_s: float = 15.0
    deflate: bool = False
    # > 0: each stream is a run of sessions of this many seconds (session churn, as in a
    # call centre), each opened as the last one ends; 0: one session for the whole step.
    session_s: float = 0.0
    api_key: str | None = None  # sent as Authorization: Bearer
    model: str = "gpt-realtime"  # realtime: the ?model= of the URL
    piece_ms: int = 20  # realtime: audio per input_audio_buffer.append
    transcription_model: str = "whisper-1"  # realtime: session audio.input.transcription
    loss: float = 0.0  # webrtc: share of the caller's outgoing audio RTP packets dropped
    seed: int = 0  # webrtc: the loss pattern's seed (plus the stream's index)
    first: int = 0  # this process drives streams first .. first + count - 1
    count: int = -1  # -1: all

    @property
    def indices(self) -> range:
        count = self.streams - self.first if self.count < 0 else self.count
        return range(self.first, self.first + count)


def make_stream(
    spec: StepSpec, index: int, raw: Raw, end_at: float
) -> WsStream | RealtimeStream | WebRtcStream:
    if spec.mode == "realtime":
        return _realtime_stream(spec, index, raw, end_at)
    if spec.mode == "webrtc":
        return _webrtc_stream(spec, index, raw, end_at)
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else None
    start = {"mode": spec.mode, "trace_id": f"bench-{index}", **spec.session}
    if spec.mode == "tts":
        return TextStream(
            spec.url,
            start,
            raw,
            texts=spec.texts or ("Hello there.",),
            first_text=index,
            end_at=end_at,
            drain_s=spec.drain_s,
            deflate=spec.deflate,
            headers=headers,
        )
    if spec.program is None:
        raise ValueError(f"mode {spec.mode} needs an audio program")
    (script,) = scripts(spec.program, [index])
    return AudioStream(
        spec.url,
        start,
        raw,
        script=script,
        end_at=end_at,
        drain_s=spec.drain_s,
        mark_every_s=spec.mark_every_s,
        mark_phase=index,
        hangover_s=spec.hangover_s,
        lateness=raw.lateness,
        deflate=spec.deflate,
        rate=session_rate(spec),
        headers=headers,
    )


def _stream_plan(spec: StepSpec, index: int, raw: Raw, end_at: float, mode: str) -> StreamPlan:
    """A Realtime session's or a WebRTC call's plan: the stream's script (its audio
    program's), its clock and drain, the key and the session's settings."""
    if spec.program is None:
        raise ValueError(f"mode {mode} needs an audio program")
    (script,) = scripts(spec.program, [index])
    return StreamPlan(
        script,
        end_at,
        spec.drain_s,
        hangover_s=spec.hangover_s,
        lateness=raw.lateness,
        api_key=spec.api_key,
        transcription_model=spec.transcription_model,
        voice=spec.session.get("voice"),
    )


def _realtime_stream(spec: StepSpec, index: int, raw: Raw, end_at: float) -> RealtimeStream:
    plan = _stream_plan(spec, index, raw, end_at, "realtime")
    return RealtimeStream(realtime_url(spec.url, spec.model), raw, plan, piece_ms=spec.piece_ms)


def _webrtc_stream(spec: StepSpec, index: int, raw: Raw, end_at: float) -> WebRtcStream:
    from voxserve.bench.webrtc_stream import WebRtcStream  # aiortc: only for calls

    plan = _stream_plan(spec, index, raw, end_at, "webrtc")
    return WebRtcStream(http_base(spec.url), raw, plan, loss=spec.loss, seed=spec.seed + index)


async def _at(when: float, work: Coroutine[Any, Any, None]) -> None:
    await asyncio.sleep(max(0.0, when - time.monotonic()))
    await work


async def watch(raw: Raw, steady_from: float, end_at: float) -> tuple[float, float]:
    """Tick every 10 ms until end_at, recording oversleep; return (cpu s, wall s) of this
    process over [steady_from, end_at]."""
    cpu0 = wall0 = None
    while (now := time.monotonic()) < end_at:
        if cpu0 is None and now >= steady_from:
            cpu0, wall0 = _cpu(), now
        await asyncio.sleep(TICK_S)
        raw.loop_lag.append(max(0.0, time.monotonic() - now - TICK_S))
    if cpu0 is None or wall0 is None:
        return 0.0, 0.0
    return _cpu() - cpu0, time.monotonic() - wall0


def _cpu() -> float:
    """CPU time of this process, all threads (ns resolution; os.times() ticks at 10 ms)."""
    return time.process_time()


def prepare_audio(spec: StepSpec) -> None:
    """What a stream would otherwise make on its first frame, made once per process before
    the step's clocks start: the step's audio at the rate its streams send, and for WebRTC
    aiortc's imports and TLS context. Made on a stream's first frame (`pcm_at` resamples the
    whole program: 73-106 ms for the fixtures' 27 s at 24 kHz), it held the loop after the
    streams' clocks had started, and their first frames went out that late: a 4 s step of
    2 streams was judged invalid for the generator's P99 send lateness (29-36 ms) on an idle
    machine (tests/bench/test_smoke.py::test_realtime_vs_stream_smoke, ~1 run in 3)."""
    program = spec.program
    if spec.mode == "webrtc":
        from voxserve.bench import webrtc_client  # aiortc: only for calls
        from voxserve.bench.webrtc_stream import RATE as WEBRTC_RATE

        webrtc_client.warm()
        if program is not None:
            pcm_at(program, WEBRTC_RATE)
    elif program is None or spec.mode == "tts":
        return
    elif spec.mode == "realtime":
        frames_b64(program)
    else:
        pcm_at(program, session_rate(spec))


def session_rate(spec: StepSpec) -> int:
    """The sample rate a /v1/stream session of the step sends at (session.start's)."""
    return int(spec.session.get("sample_rate", SAMPLE_RATE))


async def drive(spec: StepSpec, start_at: float) -> Raw:
    """Run this process's streams of the step, starting at monotonic time start_at."""
    raw = Raw()
    if spec.mode == "webrtc":
        from voxserve.bench.webrtc_client import InlineExecutor

        asyncio.get_running_loop().set_default_executor(InlineExecutor())
    offsets = start_offsets(spec.streams, spec.ramp_s)
    end_at = start_at + spec.ramp_s + spec.duration_s
    watcher = asyncio.create_task(watch(raw, start_at + spec.ramp_s, end_at))
    await asyncio.gather(
        *(_at(start_at + offsets[i], _sessions(spec, i, raw, end_at)) for i in spec.indices)
    )
    cpu_s, wall_s = await watcher
    raw.procs.append(
        {
            "pid": os.getpid(),
            "streams": len(spec.indices),
            "cpu_percent": round(100 * cpu_s / wall_s, 1) if wall_s else None,
            "lateness_p99_ms": round(percentile(raw.lateness, 99) * 1000, 3)
            if raw.lateness
            else None,
        }
    )
    return raw


async def _sessions(spec: StepSpec, index: int, raw: Raw, end_at: float) -> None:
    """One stream slot: a single session until end_at, or (session_s > 0) sessions of
    session_s seconds back to back until end_at; a slot that held more than one session
    counts in `churned_streams` (the soak's proof of churn, whatever the machine's pace)."""
    held = 0
    while True:
        now = time.monotonic()
        until = min(end_at, now + spec.session_s) if spec.session_s > 0 else end_at
        await make_stream(spec, index, raw, until).run()
        held += 1
        if spec.session_s <= 0 or time.monotonic() >= end_at - spec.session_s / 2:
            break
    if held > 1:
        raw.counts["churned_streams"] += 1


def run(spec: StepSpec, start_at: float) -> Raw:
    """Process entry point (picklable): a fresh event loop for the step, once what its
    streams need is made (`prepare_audio`, before start_at)."""
    prepare_audio(spec)
    return asyncio.run(drive(spec, start_at))

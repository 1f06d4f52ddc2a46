"""WebRTC calls end to end: real aiortc peers (voxserve/bench/webrtc_client.py) on real UDP
sockets against a real server on the real default engines (silero, whisper tiny.en, the
rules responder, piper); raw-SDP calls, multipart calls and the official `openai` SDK's
`realtime.calls.create` / `hangup`.

One server for the module (calls transcribe only, no reply, where the reply is not the
point: the 2-core CI box runs whisper and piper for every session at once).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import SecretStr

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.helpers import (
    async_sdk,
    eventually,
    fixture_audio,
    fixture_texts,
    realtime_connection,
    sessions_ended,
    wer,
)
from voxserve.audio.resample import resample
from voxserve.audio.wav import write_wav
from voxserve.bench.stats import normalize
from voxserve.bench.webrtc_client import FRAME_BYTES, WebRtcCaller, clip_source, to_48k
from voxserve.config import load_settings

KEY = "webrtc-test-key"
MEDIA_TIMEOUT_S = 2.0
TRANSCRIPT = "conversation.item.input_audio_transcription.completed"
# Transcripts only: VAD turns commit and transcribe, no response is made.
LISTEN_ONLY: dict[str, Any] = {
    "type": "realtime",
    "audio": {"input": {"turn_detection": {"type": "server_vad", "create_response": False}}},
}


@pytest.fixture(scope="module")
def call_server() -> Iterator[LiveServer]:
    """Real engines behind an API key; a vanished caller is dropped after 2 s of no RTP."""
    settings = load_settings(port=free_port(), log_level="warning", api_keys=[SecretStr(KEY)])
    webrtc = settings.webrtc.model_copy(update={"media_timeout_s": MEDIA_TIMEOUT_S})
    live = start_server(settings.model_copy(update={"webrtc": webrtc}))
    yield live
    stop_server(live)


def speech48(name: str) -> bytes:
    return to_48k(fixture_audio(name), 16_000)


def active(live: LiveServer, transport: str) -> float:
    """voxserve_sessions_active summed over modes for one transport."""
    total = 0.0
    for family in live.runtime.metrics.registry.collect():
        if family.name == "voxserve_sessions_active":
            total += sum(s.value for s in family.samples if s.labels["transport"] == transport)
    return total


LOST = "voxserve_webrtc_packets_lost_total"
CONCEALED = "voxserve_webrtc_concealed_seconds_total"


def counter(live: LiveServer, name: str) -> float:
    value = live.runtime.metrics.registry.get_sample_value(name)
    return float(value or 0.0)


def udp_sockets() -> int:
    """UDP sockets this process holds (the in-process server's and the callers')."""
    inodes: set[str] = set()
    for name in ("udp", "udp6"):
        table = Path("/proc/net") / name
        if table.exists():
            inodes |= {line.split()[9] for line in table.read_text().splitlines()[1:]}
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += link.startswith("socket:[") and link[8:-1] in inodes
    return count


def rms(pcm: bytes) -> float:
    samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)
    return float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0


async def freed(live: LiveServer, udp_before: int) -> None:
    """No live session, no call counted, every UDP socket of the calls closed."""
    await sessions_ended(live.runtime)
    assert active(live, "webrtc") == 0
    await eventually(lambda: udp_sockets() <= udp_before, timeout_s=10)


# --- a call answered, then hung up ----------------------------------------------------------


async def test_call_is_transcribed_answered_on_the_track_and_hang_up_frees_it(
    call_server: LiveServer,
) -> None:
    texts = fixture_texts()
    udp_before = udp_sockets()
    caller = WebRtcCaller(clip_source(speech48("command.wav")), keep_audio=True)
    try:
        await caller.call(call_server.http_url, KEY)
        assert caller.location and caller.call_id and caller.call_id.startswith("rtc_")
        created = await caller.wait_for("session.created", timeout_s=10)
        assert active(call_server, "webrtc") == 1, created
        final = await caller.wait_for(TRANSCRIPT, timeout_s=30)
        done = await caller.wait_for("response.done", timeout_s=60)
        said = await caller.wait_for("response.output_audio_transcript.done", timeout_s=5)
        # The reply's first sound on the track, then half a second of it.
        first = await caller.until(lambda: caller.heard.run_frames, timeout_s=10)
        start = first[0] * FRAME_BYTES
        await eventually(lambda: caller.heard.frames > first[0] + 25, timeout_s=5)
        reply = bytes(caller.heard.pcm or b"")[start : start + 25 * FRAME_BYTES]
        assert caller.responses()[0][2] is not None  # heard after response.created
        status = await caller.hang_up()
        assert status in (200, 204), status
    finally:
        await caller.close()
    assert wer(texts["command.wav"], final["transcript"]) <= 0.2, final
    assert done["response"]["status"] == "completed", done
    assert said["transcript"].strip(), said
    assert rms(reply) > 300, rms(reply)  # speech on the track, not silence
    assert not caller.of("response.output_audio.delta")  # the audio went on the track
    await freed(call_server, udp_before)
    async with httpx.AsyncClient() as client:  # gone: hanging up again is unknown
        again = await client.delete(
            f"{call_server.http_url}{caller.location}", headers={"Authorization": f"Bearer {KEY}"}
        )
    assert again.status_code == 404 and "call_not_found" in again.text, again.text


# --- 10% of the caller's packets lost ---------------------------------------------------------


async def test_ten_percent_loss_still_transcribes_and_is_counted(call_server: LiveServer) -> None:
    texts = fixture_texts()
    await sessions_ended(call_server.runtime)
    lost, concealed = counter(call_server, LOST), counter(call_server, CONCEALED)
    caller = WebRtcCaller(clip_source(speech48("weather.wav")), loss=0.10, seed=22)
    try:
        await caller.call(call_server.http_url, KEY, session=LISTEN_ONLY)
        final = await caller.wait_for(TRANSCRIPT, timeout_s=30)
        dropped = caller.loss.dropped
        assert await caller.hang_up() in (200, 204)
    finally:
        await caller.close()
    assert caller.loss.dropped >= caller.loss.sent * 0.05, caller.loss  # loss really happened
    assert wer(texts["weather.wav"], final["transcript"]) <= 0.25, final
    assert not caller.of("response.created")  # create_response false: the multipart session
    await sessions_ended(call_server.runtime)
    # The server counted the packets that never came, and the audio standing in for them.
    lost = counter(call_server, LOST) - lost
    assert 0.5 * dropped <= lost <= caller.loss.dropped + 5, (lost, dropped, caller.loss)
    assert counter(call_server, CONCEALED) - concealed >= 0.5 * dropped * 0.02
    for ended in caller.of("voxserve.session.ended"):  # if it came before the close
        assert ended["packets_lost"] > 0 and ended["concealed_ms"] > 0, ended


# --- four calls beside two WebSocket sessions --------------------------------------------------


async def websocket_session(live: LiveServer, name: str, hold: asyncio.Event | None = None) -> str:
    """A /v1/realtime transcription session through the SDK, audio at real time; open after
    its transcript until `hold` is set (closed at once without one)."""
    pcm = resample(
        np.concatenate([fixture_audio(name), np.zeros(16_000, np.int16)]), 16_000, 24_000
    ).tobytes()
    async with realtime_connection(
        live, KEY, model="gpt-realtime", extra_query={"intent": "transcription"}
    ) as conn:
        step = 4800  # 100 ms at 24 kHz
        for i in range(0, len(pcm), step):
            await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + step]).decode())
            await asyncio.sleep(0.1)
        async with asyncio.timeout(30):
            while True:
                event = json.loads(await conn.recv_bytes())
                if event["type"] == TRANSCRIPT:
                    break
        if hold is not None:
            await asyncio.wait_for(hold.wait(), 30)
        return str(event["transcript"])


async def call(live: LiveServer, name: str, *, sdk: bool, hold: asyncio.Event | None = None) -> str:
    """A call that listens; through the SDK's calls.create / hangup, or raw multipart. Hung
    up after its transcript once `hold` is set (its track sends silence meanwhile), at once
    without one."""
    caller = WebRtcCaller(clip_source(speech48(name)))
    try:
        async with async_sdk(live, KEY) as client:
            if sdk:
                offer = await caller.offer()
                answer = await client.realtime.calls.create(sdp=offer, session=LISTEN_ONLY)  # type: ignore[arg-type]
                location = answer.response.headers["location"]
                await caller.attach(answer.text, location, live.http_url, KEY)
            else:
                await caller.call(live.http_url, KEY, session=LISTEN_ONLY)
            final = await caller.wait_for(TRANSCRIPT, timeout_s=40)
            if hold is not None:
                await asyncio.wait_for(hold.wait(), 30)
            if sdk:
                assert caller.call_id
                await client.realtime.calls.hangup(caller.call_id)
            else:
                assert await caller.hang_up() in (200, 204)
    finally:
        await caller.close()
    return str(final["transcript"])


async def test_four_calls_beside_two_websocket_sessions(call_server: LiveServer) -> None:
    texts = fixture_texts()
    calls = ["command.wav", "lights.wav", "weather.wav", "reminder.wav"]
    sockets = ["lights.wav", "command.wav"]
    udp_before = udp_sockets()
    seen: list[float] = []
    # Each session stays open after its transcript until all six have been live at once:
    # on a loaded machine one call's setup (ICE, DTLS) outlasted another's whole clip, and
    # "all six at once" was left to chance.
    all_live = asyncio.Event()

    async def peak() -> None:
        while True:
            seen.append(active(call_server, "webrtc") + active(call_server, "realtime"))
            if seen[-1] == 6:
                all_live.set()
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(peak())
    try:
        results = await asyncio.gather(
            *(call(call_server, n, sdk=i % 2 == 1, hold=all_live) for i, n in enumerate(calls)),
            *(websocket_session(call_server, n, all_live) for n in sockets),
        )
    finally:
        watcher.cancel()
    for name, transcript in zip(calls + sockets, results, strict=True):
        assert wer(texts[name], transcript) <= 0.25, (name, transcript)
    assert max(seen) == 6, seen  # all six were live at once
    await freed(call_server, udp_before)


# --- the same words as over the WebSocket --------------------------------------------------


async def test_a_call_hears_a_recording_as_the_websocket_session_does(
    call_server: LiveServer,
) -> None:
    """ "Please tell me a joke." (the server's piper voice) was heard "... I'm Joe" over
    calls: the call delivers the recording as an Opus round trip gives it (sample for
    sample, no gap), but silero hears the k's release under 0.5 there, the turn ended in
    the closure and its final was the decode made at the pause. The guarantee: a call's
    transcript is the WebSocket session's for the same recording (words, normalised)."""
    name = "calls/joke.wav"
    over_websocket = await websocket_session(call_server, name)
    over_call = await call(call_server, name, sdk=False)
    assert normalize(over_call) == normalize(over_websocket), (over_call, over_websocket)
    assert normalize(over_call).endswith("joke"), over_call


# --- a caller that vanishes without a BYE ----------------------------------------------------


async def test_a_vanished_caller_is_ended_by_the_media_timeout(call_server: LiveServer) -> None:
    udp_before = udp_sockets()
    caller = WebRtcCaller(clip_source(speech48("command.wav")))
    try:
        await caller.call(call_server.http_url, KEY, session=LISTEN_ONLY)
        await caller.wait_for("session.created", timeout_s=10)
        await eventually(lambda: caller.track.sent >= 25, timeout_s=5)  # media flowing
        assert active(call_server, "webrtc") == 1
        caller.vanish()
        gone_at = time.monotonic()
        await eventually(lambda: active(call_server, "webrtc") == 0, timeout_s=MEDIA_TIMEOUT_S + 8)
        waited = time.monotonic() - gone_at
    finally:
        await caller.close()
    assert waited >= MEDIA_TIMEOUT_S * 0.5, waited  # ended by the timeout, not by a message
    await freed(call_server, udp_before)


# --- a caller whose track ends: aiortc's MediaPlayer playing a file ---------------------------


async def test_a_played_file_that_ends_still_gets_its_transcript_and_reply(
    call_server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiortc's canonical caller, `MediaPlayer(wav)` as its track: the file plays in real
    time, then the track ends and RTP stops (no trailing silence is sent). The server's
    caller audio runs on a clock (server/webrtc/inbound.py), so the VAD hears the silence
    after the speech: the turn ends, is transcribed and answered. (No RTP is no RTP: the
    call is still ended by webrtc.media_timeout_s, here the default 10 s rather than the
    module's 2 s, so that the reply has time to come.)"""
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
    from aiortc.contrib.media import MediaPlayer

    texts = fixture_texts()
    speech = fixture_audio("command.wav")
    loud = np.nonzero(np.abs(speech.astype(np.int32)) > 500)[0]
    wav = tmp_path / "command-trimmed.wav"  # the speech, cut 40 ms after its last loud sample
    wav.write_bytes(write_wav(speech[: loud[-1] + 640], 16_000))
    await sessions_ended(call_server.runtime)
    monkeypatch.setattr(call_server.runtime.settings.webrtc, "media_timeout_s", 10.0)
    player = MediaPlayer(str(wav))
    assert player.audio is not None
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTrack(player.audio)
    channel = pc.createDataChannel("oai-events")
    events: list[dict[str, Any]] = []
    channel.on("message", lambda text: events.append(json.loads(text)))

    async def first(kind: str, timeout_s: float) -> dict[str, Any]:
        await eventually(lambda: any(e["type"] == kind for e in events), timeout_s=timeout_s)
        return next(e for e in events if e["type"] == kind)

    try:
        await pc.setLocalDescription(await pc.createOffer())
        async with httpx.AsyncClient(timeout=15) as client:
            answer = await client.post(
                f"{call_server.http_url}/v1/realtime/calls",
                content=pc.localDescription.sdp.encode(),
                headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/sdp"},
            )
        assert answer.status_code == 201, answer.text
        await pc.setRemoteDescription(RTCSessionDescription(answer.text, "answer"))
        final = await first(TRANSCRIPT, timeout_s=10)
        done = await first("response.done", timeout_s=10)
    finally:
        await pc.close()
    assert player.audio.readyState == "ended"  # the file played to its end
    assert wer(texts["command.wav"], final["transcript"]) <= 0.2, final
    assert done["response"]["status"] == "completed", done
    assert [e["type"] for e in events].count("input_audio_buffer.speech_stopped") == 1
    await sessions_ended(call_server.runtime)

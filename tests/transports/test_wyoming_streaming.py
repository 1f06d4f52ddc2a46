"""Wyoming >= 1.7 streaming transcripts with the real engines, through the `wyoming`
package's client: chunks arrive while the audio is still being sent at real-time pace,
they join to the final transcript, and a client that knows only `transcript` still gets
it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import numpy as np
from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize

from tests.conftest import LiveServer
from tests.helpers import fixture_audio, fixture_texts, wer
from voxserve.server.wyoming.seats import seats_of

TIMEOUT_S = 30.0
CHUNK_S = 0.1  # Home Assistant sends ~10-30 ms chunks; 100 ms keeps the test light
RATE = 16_000


def client(live: LiveServer) -> AsyncTcpClient:
    return AsyncTcpClient("127.0.0.1", live.settings.wyoming_port, read_timeout=TIMEOUT_S)


async def send_at_real_time(wyoming: AsyncTcpClient, samples: np.ndarray) -> float:
    """Audio-start, the samples as chunks paced like a microphone, audio-stop; returns
    when audio-stop was sent (perf_counter)."""
    await wyoming.write_event(Transcribe(language="en").event())
    await wyoming.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
    step = int(RATE * CHUNK_S)
    began = time.perf_counter()
    for n, start in enumerate(range(0, samples.size, step)):
        pcm = samples[start : start + step].astype("<i2").tobytes()
        await wyoming.write_event(AudioChunk(rate=RATE, width=2, channels=1, audio=pcm).event())
        await asyncio.sleep(max(0.0, began + (n + 1) * CHUNK_S - time.perf_counter()))
    await wyoming.write_event(AudioStop().event())
    return time.perf_counter()


async def read_until(wyoming: AsyncTcpClient, kind: str) -> list[tuple[float, Event]]:
    """Events up to the first of `kind`, each with when it arrived."""
    events: list[tuple[float, Event]] = []
    while True:
        event = await wyoming.read_event()
        assert event is not None, f"connection closed before {kind}"
        events.append((time.perf_counter(), event))
        if event.type == kind:
            return events


async def test_info_says_transcripts_stream(live_server: LiveServer) -> None:
    async with client(live_server) as wyoming:
        await wyoming.write_event(Describe().event())
        (_, event), *_ = await read_until(wyoming, "info")
    (asr,) = Info.from_event(event).asr
    assert asr.supports_transcript_streaming


async def test_chunks_arrive_while_audio_is_sent_and_join_to_the_final(
    live_server: LiveServer,
) -> None:
    # Half a second of silence after the speech, as a satellite's VAD leaves it.
    samples = np.concatenate([fixture_audio("long.wav"), np.zeros(RATE // 2, np.int16)])
    async with client(live_server) as wyoming:
        sender = asyncio.create_task(send_at_real_time(wyoming, samples))
        events = await read_until(wyoming, "transcript-stop")
        stopped_at = await sender
    kinds = [event.type for _, event in events]
    assert kinds[0] == "transcript-start" and kinds[-2:] == ["transcript", "transcript-stop"]
    assert set(kinds[1:-2]) == {"transcript-chunk"}, kinds
    chunks = [(at, TranscriptChunk.from_event(e).text) for at, e in events if e.type == kinds[1]]
    early = [text for at, text in chunks if at < stopped_at]
    assert early, "no transcript-chunk before audio-stop was sent"
    assert TranscriptStart.from_event(events[0][1]).language == "en"
    final = Transcript.from_event(events[-2][1])
    # The chunks join to the final unless a final took back a partial's words.
    assert wer(final.text, "".join(text for _, text in chunks)) <= 0.2
    assert wer(fixture_texts()["long.wav"], final.text) <= 0.2, final.text
    assert final.language == "en"
    assert live_server.runtime.active_sessions == 0 or await _sessions_end(live_server)


async def test_a_client_that_reads_only_transcript_gets_it(live_server: LiveServer) -> None:
    """What a client before Wyoming 1.7 does: skip events it does not know, read
    `transcript` (here without any pacing: all audio at once)."""
    samples = fixture_audio("lights.wav")
    async with client(live_server) as wyoming:
        await wyoming.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
        pcm = samples.astype("<i2").tobytes()
        for i in range(0, len(pcm), 2048):
            chunk = AudioChunk(rate=RATE, width=2, channels=1, audio=pcm[i : i + 2048])
            await wyoming.write_event(chunk.event())
        await wyoming.write_event(AudioStop().event())
        while True:
            event = await wyoming.read_event()
            assert event is not None
            if Transcript.is_type(event.type):
                break
    text = Transcript.from_event(event).text
    assert wer(fixture_texts()["lights.wav"], text) <= 0.2, text


async def spoken(live: LiveServer, text: str) -> np.ndarray:
    """`text` in the server's own voice at 16 kHz, its leading and trailing silence off."""
    async with client(live) as wyoming:
        await wyoming.write_event(Synthesize(text=text).event())
        pcm, rate = b"", RATE
        while (event := await wyoming.read_event()) is not None and event.type != "audio-stop":
            if AudioChunk.is_type(event.type):
                chunk = AudioChunk.from_event(event)
                pcm, rate = pcm + chunk.audio, chunk.rate
    voice = np.frombuffer(pcm, "<i2").astype(np.float32)
    loud = np.flatnonzero(np.abs(voice) > 300)
    voice = voice[loud[0] : loud[-1] + 1]
    at_16k = np.interp(np.arange(0, voice.size, rate / RATE), np.arange(voice.size), voice)
    return at_16k.astype(np.int16)


async def test_a_pause_inside_a_command_does_not_split_its_transcript(
    live_server: LiveServer,
) -> None:
    """700 ms of silence (past the VAD's 500 ms hangover) inside one command: decoded as
    two segments, the first said "Set a timer for it." (Whisper base, no context);
    `transcript` is the whole command recognised at once."""
    quiet = np.zeros(RATE * 7 // 10, np.int16)
    head, tail = (
        await spoken(live_server, "Set a timer for"),
        await spoken(live_server, "five minutes"),
    )
    samples = np.concatenate([quiet[: RATE // 5], head, quiet, tail, quiet])
    async with client(live_server) as wyoming:
        await wyoming.write_event(Transcribe(language="en").event())
        await wyoming.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
        pcm = samples.astype("<i2").tobytes()
        began = time.perf_counter()
        for i in range(0, len(pcm), 2048):  # Home Assistant's 1024-sample chunks, at 4x
            chunk = AudioChunk(rate=RATE, width=2, channels=1, audio=pcm[i : i + 2048])
            await wyoming.write_event(chunk.event())
            due = began + (i + 2048) / (2 * RATE) / 4  # streamed: under partial_max_speed
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
        await wyoming.write_event(AudioStop().event())
        events = await read_until(wyoming, "transcript-stop")
    assert any(e.type == "transcript-chunk" for _, e in events)  # it was streamed
    final = Transcript.from_event(events[-2][1])
    assert wer("set a timer for 5 minutes", final.text) == 0, final.text
    assert final.language == "en"


async def _sessions_end(live: LiveServer) -> bool:
    for _ in range(100):  # the session's slot is given back as its task closes it
        if live.runtime.active_sessions == 0:
            return True
        await asyncio.sleep(0.02)
    return False


def asr_calls(live: LiveServer, work_class: str) -> float:
    """The ASR stage's calls of a work class so far (its latency histogram's count)."""
    text = httpx.get(f"{live.http_url}/metrics", timeout=10).text
    name = f'voxserve_stage_latency_seconds_count{{stage="asr",work_class="{work_class}"}}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def test_a_recording_sent_at_once_is_recognised_whole(live_server: LiveServer) -> None:
    """A one-shot request (a recording of two segments in one chunk, then audio-stop) is
    recognised whole at audio-stop, as an upload is: one bulk ASR call, no partial, no
    chunk. Its session would judge the whole recording with the VAD and decode each segment
    first, with the client waiting (one-shot P50 128 ms from audio-stop here, the decode
    alone 123-127 ms: docs/benchmarks.md).
    A live final begun before audio-stop (the VAD may have ended the first segment by
    then) is given up, so at most one live call; without this route there were three (two
    finals and the whole recognition that joins them)."""
    name = "two_turns.wav"
    samples = fixture_audio(name)
    live, bulk = await asyncio.gather(
        asyncio.to_thread(asr_calls, live_server, "live"),
        asyncio.to_thread(asr_calls, live_server, "bulk"),
    )
    async with client(live_server) as wyoming:
        await wyoming.write_event(Transcribe(language="en").event())
        await wyoming.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
        pcm = samples.astype("<i2").tobytes()
        await wyoming.write_event(AudioChunk(rate=RATE, width=2, channels=1, audio=pcm).event())
        await wyoming.write_event(AudioStop().event())
        events = await read_until(wyoming, "transcript-stop")
    kinds = [e.type for _, e in events]
    assert kinds == ["transcript-start", "transcript", "transcript-stop"], kinds
    text = Transcript.from_event(events[1][1]).text
    assert wer(fixture_texts()[name], text) <= 0.25, text
    assert live_server.runtime.active_sessions == 0  # its places free before its end
    assert seats_of(live_server.runtime).sessions == 0
    assert await asyncio.to_thread(asr_calls, live_server, "bulk") - bulk == 1
    assert await asyncio.to_thread(asr_calls, live_server, "live") - live <= 1


async def test_a_burst_of_one_shot_recordings_shares_whispers_first_batch(
    live_server: LiveServer,
) -> None:
    """Four one-shot requests whose audio is all in, then four `audio-stop`s at once: the
    first to be recognised waits for the three still on their way (Batcher.expect_bulk),
    so Whisper's first bulk batch holds all four. A lone request waits for nobody (its
    20 ms gathering wait was a one-shot transcript's pure delay): tests/test_bulk_windows.py."""
    batcher = live_server.runtime.generation.asr_batcher()
    assert batcher is not None
    seen: list[int] = []
    real = batcher.run_bulk

    def recording(items: list[Any]) -> list[Any]:
        seen.append(len(items))
        return real(items)

    names = ["command.wav", "lights.wav", "weather.wav", "reminder.wav"]
    clients = [client(live_server) for _ in names]
    batcher.run_bulk = recording
    try:
        for wyoming, name in zip(clients, names, strict=True):
            await wyoming.connect()
            await wyoming.write_event(Transcribe(language="en").event())
            await wyoming.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
            pcm = fixture_audio(name).astype("<i2").tobytes()
            chunk = AudioChunk(rate=RATE, width=2, channels=1, audio=pcm)
            await wyoming.write_event(chunk.event())
        for _ in range(250):  # every recording in at the server, none stopped yet
            if batcher.bulk_on_the_way == len(names):
                break
            await asyncio.sleep(0.02)
        assert batcher.bulk_on_the_way == len(names)
        await asyncio.gather(*(w.write_event(AudioStop().event()) for w in clients))
        finals = [await read_until(w, "transcript") for w in clients]
    finally:
        batcher.run_bulk = real
        for wyoming in clients:
            await wyoming.disconnect()
    for name, events in zip(names, finals, strict=True):
        text = Transcript.from_event(events[-1][1]).text
        assert wer(fixture_texts()[name], text) <= 0.25, (name, text)
    assert seen[0] == len(names), seen
    assert batcher.bulk_on_the_way == 0

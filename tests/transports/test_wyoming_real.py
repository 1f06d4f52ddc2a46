"""Wyoming end to end with the real engines, through the `wyoming` package's own client and
event classes (what Home Assistant's integration uses)."""

from __future__ import annotations

import asyncio

import numpy as np
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from tests.conftest import LiveServer
from tests.helpers import fixture_audio, fixture_texts, wer
from voxserve.pipeline.recognition.bulk import transcribe

TIMEOUT_S = 30.0


def client(live: LiveServer) -> AsyncTcpClient:
    return AsyncTcpClient("127.0.0.1", live.settings.wyoming_port, read_timeout=TIMEOUT_S)


async def read_until(wyoming: AsyncTcpClient, kind: str) -> list[Event]:
    events: list[Event] = []
    while True:
        event = await wyoming.read_event()
        assert event is not None, f"connection closed before {kind}"
        events.append(event)
        if event.type == kind:
            return events


async def test_describe_lists_the_real_voices_and_asr_model(live_server: LiveServer) -> None:
    async with client(live_server) as wyoming:
        await wyoming.write_event(Describe().event())
        (event,) = await read_until(wyoming, "info")
    info = Info.from_event(event)
    (asr,) = info.asr
    assert asr.installed and asr.models[0].name == "tiny.en" and "en" in asr.models[0].languages
    (tts,) = info.tts
    assert tts.supports_synthesize_streaming
    names = {voice.name for voice in tts.voices}
    assert "joe" in names and {v.id for v in live_server.runtime.engines.voices()} == names


async def test_transcribe_round_trip(live_server: LiveServer) -> None:
    samples = fixture_audio("lights.wav")
    pcm = samples.astype("<i2").tobytes()
    async with client(live_server) as wyoming:
        await wyoming.write_event(Transcribe(language="en").event())
        await wyoming.write_event(AudioStart(rate=16_000, width=2, channels=1).event())
        for i in range(0, len(pcm), 2048):
            chunk = AudioChunk(rate=16_000, width=2, channels=1, audio=pcm[i : i + 2048])
            await wyoming.write_event(chunk.event())
        await wyoming.write_event(AudioStop().event())
        events = await read_until(wyoming, "transcript")
    transcript = Transcript.from_event(events[-1])
    assert wer(fixture_texts()["lights.wav"], transcript.text) <= 0.2, transcript.text
    assert transcript.language == "en"


async def _audio_of(events: list[Event]) -> tuple[bytes, int]:
    starts = [AudioStart.from_event(e) for e in events if AudioStart.is_type(e.type)]
    assert len(starts) == 1, "one audio-start per request"
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    assert chunks and all(c.rate == starts[0].rate and c.width == 2 for c in chunks)
    kinds = [e.type for e in events]
    assert kinds.index("audio-start") < kinds.index("audio-chunk") < kinds.index("audio-stop")
    return b"".join(c.audio for c in chunks), starts[0].rate


async def test_synthesize_one_shot(live_server: LiveServer) -> None:
    text = "Please turn on the lights."
    async with client(live_server) as wyoming:
        await wyoming.write_event(Synthesize(text=text, voice=SynthesizeVoice(name="joe")).event())
        events = await read_until(wyoming, "audio-stop")
    pcm, rate = await _audio_of(events)
    assert rate == 22_050  # the voice's own rate: no resampling
    samples = np.frombuffer(pcm, dtype="<i2")
    result = await transcribe(live_server.runtime, samples, rate)
    assert wer(text, result.text) <= 0.2, result.text


async def test_synthesize_streaming(live_server: LiveServer) -> None:
    pieces = ["Good morning. The train", " to Boston leaves", " at nine."]
    async with client(live_server) as wyoming:
        await wyoming.write_event(SynthesizeStart(voice=SynthesizeVoice(name="joe")).event())
        for piece in pieces:
            await wyoming.write_event(SynthesizeChunk(text=piece).event())
        # Home Assistant also sends the whole text, for servers that do not stream.
        await wyoming.write_event(Synthesize(text="".join(pieces)).event())
        await wyoming.write_event(SynthesizeStop().event())
        events = await read_until(wyoming, "synthesize-stopped")
        # Nothing else follows: the compatibility `synthesize` was not spoken again.
        await wyoming.write_event(Describe().event())
        after = await read_until(wyoming, "info")
    assert SynthesizeStopped.is_type(events[-1].type) and len(after) == 1
    assert [e.type for e in events].count("audio-stop") == 1
    pcm, rate = await _audio_of(events)
    result = await transcribe(live_server.runtime, np.frombuffer(pcm, dtype="<i2"), rate)
    assert wer("".join(pieces), result.text) <= 0.25, result.text


async def test_connections_are_served_concurrently(live_server: LiveServer) -> None:
    async def one(text: str) -> int:
        async with client(live_server) as wyoming:
            await wyoming.write_event(Synthesize(text=text).event())
            events = await read_until(wyoming, "audio-stop")
        pcm, _ = await _audio_of(events)
        return len(pcm)

    sizes = await asyncio.gather(*(one(f"Number {n}.") for n in range(4)))
    assert all(size > 0 for size in sizes)
    assert live_server.runtime.active_sessions == 0

"""Wyoming plumbing with fake engines: audio formats, errors as `error` events carrying the
voxserve code, and the session limit."""

from __future__ import annotations

import numpy as np
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStop, SynthesizeVoice

from tests.conftest import LiveServer
from tests.fakes import silence, tone


def client(live: LiveServer) -> AsyncTcpClient:
    return AsyncTcpClient("127.0.0.1", live.settings.wyoming_port, read_timeout=10.0)


async def next_event(wyoming: AsyncTcpClient) -> Event:
    event = await wyoming.read_event()
    assert event is not None
    return event


async def transcript_of(wyoming: AsyncTcpClient) -> Transcript:
    """The request's `transcript`, past the streaming events before it."""
    while not Transcript.is_type((event := await next_event(wyoming)).type):
        assert event.type in ("transcript-start", "transcript-chunk"), event
    return Transcript.from_event(event)


async def error_of(wyoming: AsyncTcpClient, *events: Event) -> str | None:
    for event in events:
        await wyoming.write_event(event)
    reply = await next_event(wyoming)
    assert Error.is_type(reply.type), reply
    return Error.from_event(reply).code


async def send_audio(wyoming: AsyncTcpClient, pcm: bytes, rate: int, channels: int) -> None:
    await wyoming.write_event(AudioStart(rate=rate, width=2, channels=channels).event())
    for i in range(0, len(pcm), 4096):
        chunk = AudioChunk(rate=rate, width=2, channels=channels, audio=pcm[i : i + 4096])
        await wyoming.write_event(chunk.event())
    await wyoming.write_event(AudioStop().event())


async def test_stereo_8k_audio_is_mixed_down_and_resampled(fake_server: LiveServer) -> None:
    mono = np.concatenate([silence(0.2, 8000), tone(500, 1.0, 8000), silence(0.2, 8000)])
    stereo = np.repeat(mono, 2)  # L R L R ...
    async with client(fake_server) as wyoming:
        await wyoming.write_event(Transcribe().event())
        await send_audio(wyoming, stereo.astype("<i2").tobytes(), 8000, 2)
        reply = await transcript_of(wyoming)
    assert reply.text == "tone500"


async def test_errors_are_events_with_voxserve_codes(fake_server: LiveServer) -> None:
    async with client(fake_server) as wyoming:
        unknown = Synthesize(text="Hi.", voice=SynthesizeVoice(name="alloy")).event()
        assert await error_of(wyoming, unknown) == "unknown_voice"
        no_lang = Synthesize(text="Hi.", voice=SynthesizeVoice(language="xx")).event()
        assert await error_of(wyoming, no_lang) == "unknown_language"
        assert await error_of(wyoming, Synthesize(text=" ").event()) == "empty_text"
        early = SynthesizeChunk(text="Hello.").event()
        assert await error_of(wyoming, early) == "not_started"
        assert await error_of(wyoming, SynthesizeStop().event()) == "not_started"
        assert await error_of(wyoming, Transcribe(language="xx").event()) == "unknown_language"
        assert await error_of(wyoming, AudioStop().event()) == "empty_audio"
        eight_bit = AudioChunk(rate=16000, width=1, channels=1, audio=b"\0" * 8).event()
        assert await error_of(wyoming, eight_bit) == "unsupported_encoding"
        odd = AudioChunk(rate=16000, width=2, channels=1, audio=b"\0" * 3).event()
        assert await error_of(wyoming, odd) == "odd_length_pcm"
        # The connection is still good after all that.
        await wyoming.write_event(Ping(text="still here").event())
        assert Pong.from_event(await next_event(wyoming)).text == "still here"
        await wyoming.write_event(Describe().event())
        assert (await next_event(wyoming)).type == "info"
    assert fake_server.runtime.active_sessions == 0


async def test_request_beyond_the_session_limit_is_refused(
    one_session_server: LiveServer,
) -> None:
    runtime = one_session_server.runtime
    async with client(one_session_server) as first, client(one_session_server) as second:
        await first.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        await first.write_event(Ping().event())  # answered once audio-start was handled
        assert Pong.is_type((await next_event(first)).type)
        assert runtime.active_sessions == 1
        assert await error_of(second, Synthesize(text="Hello.").event()) == "overloaded"
        pcm = np.concatenate([tone(700, 0.6), silence(0.2)]).astype("<i2").tobytes()
        await first.write_event(AudioChunk(rate=16000, width=2, channels=1, audio=pcm).event())
        await first.write_event(AudioStop().event())
        assert (await transcript_of(first)).text == "tone700"
    assert runtime.active_sessions == 0

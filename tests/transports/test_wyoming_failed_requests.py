"""A Wyoming transcription that fails ends at once with `error`, an empty `transcript` (and
`transcript-stop` once `transcript-start` was out): Home Assistant's speech-to-text skips
`error` and reads until `transcript`, so without it the pipeline hung for
`limits.idle_timeout_s`. The rest of the failed request's audio is dropped quietly (no
second error at its audio-stop) and the same connection serves the next request."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator

import numpy as np
import pytest
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.ping import Ping, Pong

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeAsr, fake_runtime, silence, tone
from tests.helpers import ErrorRecords, eventually, fixture_audio, fixture_texts, wer
from voxserve.config import QuotaLimits, QuotasConfig, load_settings

RATE = 16_000
READ_S = 5.0  # far below idle_timeout_s: an answer that waits for it fails the test


def pcm(samples: np.ndarray) -> bytes:
    return samples.astype("<i2").tobytes()


def chunk(audio: bytes, width: int = 2) -> Event:
    return AudioChunk(rate=RATE, width=width, channels=1, audio=audio).event()


async def next_event(wyoming: AsyncTcpClient) -> Event:
    event = await asyncio.wait_for(wyoming.read_event(), READ_S)
    assert event is not None, "connection closed"
    return event


async def failed_end(wyoming: AsyncTcpClient, *, started: bool = False) -> str | None:
    """The error's code; it is followed by an empty `transcript` and, when `started`
    (`transcript-start` is out), `transcript-stop`; read at once, before any audio-stop."""
    first = await next_event(wyoming)
    assert Error.is_type(first.type), first
    event = await next_event(wyoming)
    assert Transcript.is_type(event.type), event
    assert Transcript.from_event(event).text == ""
    if started:
        assert (await next_event(wyoming)).type == "transcript-stop"
    return Error.from_event(first).code


async def quiet_until_pong(wyoming: AsyncTcpClient) -> None:
    """Nothing more for the failed request: the next event is the answer to a ping."""
    await wyoming.write_event(Ping(text="next").event())
    event = await next_event(wyoming)
    assert Pong.is_type(event.type), event


async def transcript_text(wyoming: AsyncTcpClient, audio: bytes) -> str:
    await wyoming.write_event(Transcribe(language="en").event())
    await wyoming.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
    for i in range(0, len(audio), 4096):
        await wyoming.write_event(chunk(audio[i : i + 4096]))
    await wyoming.write_event(AudioStop().event())
    while not Transcript.is_type((event := await next_event(wyoming)).type):
        assert event.type in ("transcript-start", "transcript-chunk"), event
    assert (await next_event(wyoming)).type == "transcript-stop"
    return Transcript.from_event(event).text


async def stream_until_text(wyoming: AsyncTcpClient) -> None:
    """A tone and a pause (the fake engine's one-word partials never look stable: the
    segment's final sends the text) until the first `transcript-chunk` is back."""
    await wyoming.write_event(chunk(pcm(np.concatenate([tone(500, 0.6), silence(0.7)]))))
    while (event := await next_event(wyoming)).type != "transcript-chunk":
        assert event.type == "transcript-start", event


@pytest.fixture(scope="module")
def quota_server() -> Iterator[LiveServer]:
    """Fake engines; the anonymous caller (every Wyoming client) may send 6 s of audio."""
    quotas = QuotasConfig(anonymous=True, default=QuotaLimits(audio_s_per_min=6.0))
    settings = load_settings(port=free_port(), log_level="warning")
    settings = settings.model_copy(update={"quotas": quotas})
    live = start_server(
        settings, fake_runtime(settings, asr=FakeAsr(delay_s=0.02)), wyoming_port=free_port()
    )
    yield live
    stop_server(live)


async def test_over_quota_mid_stream_closes_the_stream_and_the_connection_goes_on(
    quota_server: LiveServer,
) -> None:
    async with AsyncTcpClient("127.0.0.1", quota_server.settings.wyoming_port) as wyoming:
        await wyoming.write_event(Transcribe(language="en").event())
        await wyoming.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
        await stream_until_text(wyoming)  # transcript-start is out before the request fails
        await wyoming.write_event(chunk(pcm(tone(500, 5.0))))  # 1.3 s + 5 s: past the 6 s
        assert await failed_end(wyoming, started=True) == "quota_exceeded"
        await wyoming.write_event(chunk(pcm(tone(500, 0.5))))  # HA sends on, then stops
        await wyoming.write_event(AudioStop().event())
        await quiet_until_pong(wyoming)
        audio = pcm(np.concatenate([tone(700, 0.6), silence(0.3)]))
        assert await transcript_text(wyoming, audio) == "tone700"
    assert quota_server.runtime.active_sessions == 0


async def test_refused_request_gets_its_transcript_at_once(one_session_server: LiveServer) -> None:
    port = one_session_server.settings.wyoming_port
    async with AsyncTcpClient("127.0.0.1", port) as first, AsyncTcpClient("127.0.0.1", port) as hc:
        await first.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
        await first.write_event(Ping().event())  # answered once audio-start was handled
        assert Pong.is_type((await next_event(first)).type)
        # Home Assistant's order: transcribe, audio-start, audio..., audio-stop, then read.
        await hc.write_event(Transcribe(language="en").event())
        await hc.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
        await hc.write_event(chunk(pcm(tone(500, 0.5))))
        await hc.write_event(AudioStop().event())
        assert await failed_end(hc) == "overloaded"
        await quiet_until_pong(hc)
        await first.write_event(AudioStop().event())  # no audio: fails too, frees the slot
        assert await failed_end(first) == "empty_audio"
        assert one_session_server.runtime.active_sessions == 0  # freed before its end is sent
        audio = pcm(np.concatenate([tone(600, 0.6), silence(0.3)]))
        assert await transcript_text(hc, audio) == "tone600"


async def test_bad_encoding_then_a_real_transcription_on_one_connection(
    live_server: LiveServer,
) -> None:
    """The real engines: an 8-bit chunk fails the request; the fixture then transcribes."""
    speech = pcm(fixture_audio("lights.wav"))
    async with AsyncTcpClient("127.0.0.1", live_server.settings.wyoming_port) as wyoming:
        await wyoming.write_event(Transcribe(language="en").event())
        await wyoming.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
        await wyoming.write_event(chunk(b"\x80" * 3200, width=1))
        assert await failed_end(wyoming) == "unsupported_encoding"
        await wyoming.write_event(chunk(speech[:6400]))
        await wyoming.write_event(AudioStop().event())
        await quiet_until_pong(wyoming)
        text = await transcript_text(wyoming, speech)
    assert wer(fixture_texts()["lights.wav"], text) <= 0.2, text


@pytest.mark.parametrize("leaves", ["mid_stream", "after_audio_stop", "sent_at_once"])
async def test_a_client_gone_mid_transcript_leaves_no_task_error(
    fake_server: LiveServer, leaves: str
) -> None:
    """The client leaves while its transcript is being made or written: the request ends,
    its session is closed, and nothing is logged as an error (the request's task failing
    to write must be awaited, not left for the garbage collector to report)."""
    errors = ErrorRecords()
    logging.getLogger().addHandler(errors)
    try:
        for _ in range(3):
            wyoming = AsyncTcpClient("127.0.0.1", fake_server.settings.wyoming_port)
            await wyoming.connect()
            await wyoming.write_event(Transcribe(language="en").event())
            await wyoming.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
            if leaves != "sent_at_once":
                await stream_until_text(wyoming)
            audio = pcm(np.concatenate([tone(700, 0.6), silence(0.7)]))
            await wyoming.write_event(chunk(audio))
            if leaves != "mid_stream":
                await wyoming.write_event(AudioStop().event())
            assert wyoming._writer is not None
            wyoming._writer.transport.abort()  # gone, with its answer on the way
            await eventually(lambda: fake_server.runtime.active_sessions == 0)
        await asyncio.sleep(0.5)
        gc.collect()  # an exception never retrieved is logged when its task is collected
        await asyncio.sleep(0.1)
    finally:
        logging.getLogger().removeHandler(errors)
    assert [r.getMessage() for r in errors.records] == []

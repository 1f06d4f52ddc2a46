"""The Wyoming wake service end to end: the real microWakeWord models behind the real server,
spoken to by the server's own TTS (piper `joe`), through the `wyoming` package's client and
event classes (what Home Assistant's integration and satellites use)."""

from __future__ import annotations

import asyncio

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.wake import Detect, Detection, NotDetected

from tests.conftest import LiveServer
from tests.helpers import spoken
from voxserve.types import SAMPLE_RATE

TIMEOUT_S = 30.0
CHUNK = 1024 * 2  # 64 ms of 16 kHz 16-bit mono per audio-chunk, as satellites send


def pcm_of(live: LiveServer, text: str) -> bytes:
    return spoken(live.runtime, text).astype("<i2").tobytes()


def client(live: LiveServer) -> AsyncTcpClient:
    return AsyncTcpClient("127.0.0.1", live.settings.wyoming_port, read_timeout=TIMEOUT_S)


async def detect(
    live: LiveServer, pcm: bytes, names: list[str] | None, clock_ms: int | None = None
) -> list[Event]:
    """One detect request, audio sent as fast as the server takes it (chunks stamped from
    `clock_ms` on the client's clock, if given); the answers up to the first `detection` or
    `not-detected` (or `error`)."""
    async with client(live) as wyoming:
        await wyoming.write_event(Detect(names=names).event())
        await wyoming.write_event(AudioStart(rate=SAMPLE_RATE, width=2, channels=1).event())
        for i in range(0, len(pcm), CHUNK):
            at = None if clock_ms is None else clock_ms + i // (2 * SAMPLE_RATE // 1000)
            audio = pcm[i : i + CHUNK]
            chunk = AudioChunk(rate=SAMPLE_RATE, width=2, channels=1, audio=audio, timestamp=at)
            await wyoming.write_event(chunk.event())
        await wyoming.write_event(AudioStop().event())
        events = []
        while True:
            event = await wyoming.read_event()
            assert event is not None, "connection closed before an answer"
            events.append(event)
            if event.type in ("not-detected", "error"):
                return events
            if event.type == "detection":
                # The stream goes on after a detection: the answer to audio-stop is nothing
                # more (a ping's pong shows that everything before it was answered).
                await wyoming.write_event(Event(type="ping"))
                while (event := await wyoming.read_event()) is not None:
                    if event.type == "pong":
                        return events
                    events.append(event)
                raise AssertionError("connection closed before pong")


async def test_info_lists_the_wake_models(live_server: LiveServer) -> None:
    async with client(live_server) as wyoming:
        await wyoming.write_event(Describe().event())
        while (event := await wyoming.read_event()) is not None and event.type != "info":
            pass
    assert event is not None
    (wake,) = Info.from_event(event).wake
    models = {model.name: model for model in wake.models}
    assert set(models) == {"okay_nabu", "hey_jarvis", "hey_mycroft", "alexa"}
    nabu = models["okay_nabu"]
    assert nabu.phrase == "Okay Nabu" and nabu.installed and "en" in nabu.languages
    assert nabu.attribution.name == "Kevin Ahrendt"


async def test_okay_nabu_is_detected_once(live_server: LiveServer) -> None:
    pcm = pcm_of(live_server, "Okay, Nabu, turn on the lights.")
    events = await detect(live_server, pcm, ["okay_nabu"])
    detections = [Detection.from_event(e) for e in events if Detection.is_type(e.type)]
    assert [d.name for d in detections] == ["okay_nabu"], events  # refractory: once
    # The timestamp is the detection's place in the audio: after "Nabu", before the end.
    seconds = len(pcm) / 2 / SAMPLE_RATE
    assert detections[0].timestamp is not None and 500 < detections[0].timestamp < seconds * 1000
    # On the client's clock when its chunks carry timestamps (a satellite's own clock).
    stamped = await detect(live_server, pcm, ["okay_nabu"], clock_ms=7_000_000)
    (detection,) = [Detection.from_event(e) for e in stamped if Detection.is_type(e.type)]
    assert detection.timestamp == 7_000_000 + detections[0].timestamp, detection
    assert not any(NotDetected.is_type(e.type) for e in events)


async def test_no_names_listens_for_every_model(live_server: LiveServer) -> None:
    events = await detect(live_server, pcm_of(live_server, "Hey Jarvis."), None)
    assert [Detection.from_event(e).name for e in events if e.type == "detection"] == ["hey_jarvis"]


async def test_another_word_and_silence_are_not_detected(live_server: LiveServer) -> None:
    jarvis = await detect(live_server, pcm_of(live_server, "Hey Jarvis."), ["okay_nabu"])
    assert [e.type for e in jarvis] == ["not-detected"]
    silence = await detect(live_server, bytes(SAMPLE_RATE * 2 * 2), ["okay_nabu"])
    assert [e.type for e in silence] == ["not-detected"]


async def refused(live: LiveServer, name: str, width: int) -> list[Event]:
    """A detect for `name`, three chunks of `width`-byte samples and audio-stop: every
    answer up to a ping's pong (everything before it was answered)."""
    async with client(live) as wyoming:
        await wyoming.write_event(Detect(names=[name]).event())
        await wyoming.write_event(AudioStart(rate=SAMPLE_RATE, width=width, channels=1).event())
        for _ in range(3):
            await wyoming.write_event(AudioChunk(SAMPLE_RATE, width, 1, bytes(CHUNK)).event())
        await wyoming.write_event(AudioStop().event())
        await wyoming.write_event(Event(type="ping"))
        events = []
        while (event := await wyoming.read_event()) is not None and event.type != "pong":
            events.append(event)
    return events


async def test_unknown_name_is_refused_once_with_the_valid_ones(live_server: LiveServer) -> None:
    # The audio that follows the refused detect (a satellite streams on) is dropped: it
    # starts no transcription, and the error is said once.
    events = await refused(live_server, "hey_siri", width=2)
    assert [e.type for e in events] == ["error"], events
    error = Error.from_event(events[0])
    assert error.code == "unknown_wake_word" and "okay_nabu" in error.text, error


async def test_a_bad_width_is_refused_once(live_server: LiveServer) -> None:
    events = await refused(live_server, "okay_nabu", width=4)
    assert [e.type for e in events] == ["error"], events
    assert Error.from_event(events[0]).code == "unsupported_encoding", events


async def test_20_concurrent_streams_each_get_their_own_answer(live_server: LiveServer) -> None:
    nabu = pcm_of(live_server, "Okay Nabu.")
    other = pcm_of(live_server, "Turn on the lights.")
    # Even streams say the word, odd ones do not; chunks interleave across the 20.
    answers = await asyncio.gather(
        *(detect(live_server, nabu if i % 2 == 0 else other, ["okay_nabu"]) for i in range(20))
    )
    for i, events in enumerate(answers):
        kinds = [e.type for e in events]
        assert kinds == (["detection"] if i % 2 == 0 else ["not-detected"]), (i, kinds)

"""Turn-taking on the real speech engines (silero, whisper tiny.en, the rules responder):
semantic_vad ends a complete sentence sooner than server_vad, a pause after "and" does not
end the turn, and a speculative reply is held back, released once, or withdrawn unseen.

The audio is fed 64 ms (one VAD batch) at a time, and a speculative decode started at a
tentative end is let finish before more audio comes: as if ASR were instant, so where a turn
ends depends on what was said, not on how busy the machine is (no timing in these tests)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import numpy as np
import pytest

from tests.fakes import SR, FakeAsr, FakeTts, fake_runtime, silence, tone
from tests.helpers import fixture_audio
from voxserve.config import load_settings
from voxserve.engines.loaded import Engines
from voxserve.engines.micro_wakeword import Detection
from voxserve.engines.responders import RulesResponder
from voxserve.engines.silero_vad import SileroVad
from voxserve.engines.whisper_asr import WhisperAsr
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import (
    ErrorEvent,
    Event,
    Mode,
    ResponseDelta,
    ResponseText,
    SessionEnded,
    StreamConfig,
    TranscriptFinal,
    TtsStart,
    TurnDetection,
    VadEnd,
    WakeDetected,
)
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.session import Session
from voxserve.pipeline.turns.wake_gate import WakeGate
from voxserve.runtime import Runtime
from voxserve.types import AsrResult

BATCH = SR * 64 // 1000
FRAME = SR // 50


class CountingResponder(RulesResponder):
    """The rules responder, recording the text of every call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def respond(
        self, text: str, history: Sequence[tuple[str, str]]
    ) -> AsyncGenerator[str, None]:
        self.calls.append(text)
        async for piece in super().respond(text, history):
            yield piece


@pytest.fixture(scope="module")
def asr() -> WhisperAsr:
    return WhisperAsr()


def runtime(asr: WhisperAsr, responder: CountingResponder | None = None) -> Runtime:
    engines = Engines(
        vad=SileroVad(),
        asr=asr,
        tts=[FakeTts()],
        responder=responder or CountingResponder(),
        default_voice="fake",
    )
    return Runtime.from_engines(load_settings(log_level="warning"), engines)


class Turns:
    """Runs a session; `feed` returns the events queued so far."""

    def __init__(self, rt: Runtime, config: StreamConfig) -> None:
        self.session = Session(rt.session_context(), config, Outbox(4096))
        self.seq = 0
        self.fed = 0  # samples
        self.events: list[Event] = []
        self.vad_end_fed: list[int] = []  # samples fed when each vad.end was queued
        self.instant = True  # False: a decode at a pause comes back when `decoded` is awaited
        self.step = BATCH  # samples fed before the session settles (more: VAD runs behind)

    async def feed(self, *parts: np.ndarray) -> None:
        audio = np.concatenate(parts).astype(np.int16)
        for i in range(0, audio.size, self.step):
            chunk = audio[i : i + self.step]
            for j in range(0, chunk.size, FRAME):
                frame = chunk[j : j + FRAME]
                await self.session.feed_audio(self.seq, memoryview(frame.tobytes()))
                self.seq += 1
            self.fed += chunk.size
            await self._settle()

    async def _settle(self) -> None:
        listener = self.session.listener
        assert listener is not None
        async with asyncio.timeout(20):
            while True:
                while len(listener.ring) >= listener.batch_samples or listener._holder:  # noqa: ASYNC110
                    await asyncio.sleep(0.002)
                spec = listener.speculation.spec
                if spec is None or spec.task.done() or not self.instant:
                    break
                await asyncio.wait([spec.task])  # "instant" ASR: back before more audio
            await asyncio.sleep(0.01)  # the decode's control, a reply's first steps
            while listener._holder or listener._controls:  # noqa: ASYNC110
                await asyncio.sleep(0.002)
        while self.session.outbox.qsize():
            item = await self.session.outbox.next()
            if isinstance(item, Event):
                self.events.append(item)
                if isinstance(item, VadEnd):
                    self.vad_end_fed.append(self.fed)

    async def decoded(self) -> None:
        """The decode started at the pause, back now (`instant` False: late)."""
        spec = self.session.listener.speculation.spec if self.session.listener else None
        if spec is not None:
            await asyncio.wait([spec.task])
        self.instant = True
        await self._settle()

    async def run(self, *parts: np.ndarray | None) -> list[Event]:
        """Feeds `parts`; None: the decode started at the pause is back (`decoded`)."""
        running = asyncio.create_task(self.session.run())
        try:
            for part in parts:
                await (self.decoded() if part is None else self.feed(part))
            await self.session.end_input()
            await asyncio.wait_for(asyncio.shield(running), 30)
        finally:
            if not running.done():
                running.cancel()
        await self._settle()
        assert isinstance(self.events[-1], SessionEnded)
        return self.events


def of(events: list[Event], kind: type[Event]) -> list[Event]:
    return [e for e in events if isinstance(e, kind)]


async def silence_waited(asr: WhisperAsr, detection: TurnDetection) -> int:
    """ms of silence fed after "What time is it?" when its turn ended."""
    turns = Turns(runtime(asr), StreamConfig(mode="asr", turn_detection=detection))
    events = await turns.run(silence(0.3), fixture_audio("command.wav"), silence(1.5))
    (end,) = of(events, VadEnd)
    assert isinstance(end, VadEnd)
    return turns.vad_end_fed[0] * 1000 // SR - end.end_ms


async def test_semantic_vad_ends_a_complete_sentence_sooner_than_server_vad(
    asr: WhisperAsr,
) -> None:
    semantic = await silence_waited(asr, TurnDetection(type="semantic_vad", eagerness="auto"))
    fixed = await silence_waited(asr, TurnDetection(type="server_vad", silence_duration_ms=500))
    assert fixed >= 500
    assert semantic <= 400 < fixed, (semantic, fixed)


async def test_a_pause_after_and_does_not_end_the_turn(asr: WhisperAsr) -> None:
    """ "The meeting went well and [500 ms] the client wants a second proposal.": one turn,
    one final with both halves; the decode made at the pause was dropped (and counted)."""
    rt = runtime(asr)
    detection = TurnDetection(type="semantic_vad", eagerness="auto")
    turns = Turns(rt, StreamConfig(mode="asr", turn_detection=detection))
    cancelled = rt.metrics.speculative_cancelled._value.get()
    audio = fixture_audio("turns/meeting_and.wav")
    events = await turns.run(silence(0.2), audio, silence(1.5))
    finals = [e.text.lower() for e in of(events, TranscriptFinal) if isinstance(e, TranscriptFinal)]
    assert len(of(events, VadEnd)) == 1, finals
    assert "meeting" in finals[0] and "proposal" in finals[0], finals
    assert rt.metrics.speculative_cancelled._value.get() >= cancelled + 1


async def test_a_pause_after_for_is_not_heard_as_a_question(asr: WhisperAsr) -> None:
    """ "Can you book a table for [640 ms] four people on Friday evening?": given the pause's
    silence beyond the VAD's end, Whisper writes "Can you book a table for it?", a complete
    question that ended the turn in the pause. The decode at the pause gets the audio up to
    the VAD's end only (vad.pause_tail_ms 0), so it reads "... a table for", and the turn
    goes on, also when the audio received is well ahead of the VAD (a busy server: here
    192 ms arrive at a time)."""
    detection = TurnDetection(type="semantic_vad", eagerness="auto")
    turns = Turns(runtime(asr), StreamConfig(mode="asr", turn_detection=detection))
    turns.step = 3 * BATCH
    events = await turns.run(silence(0.2), fixture_audio("turns/table_for.wav"), silence(1.5))
    finals = [e.text.lower() for e in of(events, TranscriptFinal) if isinstance(e, TranscriptFinal)]
    assert len(of(events, VadEnd)) == 1, finals
    assert "table for" in finals[0] and "friday" in finals[0], finals


async def test_a_speculative_reply_is_withdrawn_unseen_when_the_user_goes_on(
    asr: WhisperAsr,
) -> None:
    """Assistant mode: at the pause after "and" the reply to the text so far is made but
    held back; the user goes on, so it is dropped (metric), nothing of it reaches the client,
    and the one reply the client gets answers the whole turn. Each text asked once."""
    responder = CountingResponder()
    rt = runtime(asr, responder)
    cancelled = rt.metrics.speculative_cancelled._value.get()
    detection = TurnDetection(type="semantic_vad", eagerness="auto")
    turns = Turns(rt, StreamConfig(mode="assistant", turn_detection=detection))
    events = await turns.run(silence(0.2), fixture_audio("turns/meeting_and.wav"), silence(2.0))
    (final,) = of(events, TranscriptFinal)
    assert isinstance(final, TranscriptFinal)
    assert len(responder.calls) == 2 and responder.calls[-1] == final.text, responder.calls
    assert "proposal" not in responder.calls[0].lower()  # the speculative one: the pause's
    assert len(set(responder.calls)) == 2  # never asked twice for the same text
    assert rt.metrics.speculative_cancelled._value.get() == cancelled + 1
    assert len(of(events, TtsStart)) == 1
    (text,) = of(events, ResponseText)
    deltas = "".join(e.text for e in of(events, ResponseDelta) if isinstance(e, ResponseDelta))
    assert isinstance(text, ResponseText) and deltas.strip() == text.text


async def test_a_confirmed_speculative_reply_is_released_and_asked_once(
    asr: WhisperAsr,
) -> None:
    """server_vad 500 ms: the reply made at the tentative end (128 ms) is the one released
    when the turn ends with the same text; the responder is asked once."""
    responder = CountingResponder()
    rt = runtime(asr, responder)
    detection = TurnDetection(type="server_vad", silence_duration_ms=500)
    turns = Turns(rt, StreamConfig(mode="assistant", turn_detection=detection))
    events = await turns.run(silence(0.2), fixture_audio("command.wav"), silence(1.5))
    (final,) = of(events, TranscriptFinal)
    assert isinstance(final, TranscriptFinal)
    assert responder.calls == [final.text]
    assert len(of(events, TtsStart)) == 1 and len(of(events, ResponseText)) == 1
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("VadEnd") < kinds.index("TranscriptFinal") < kinds.index("ResponseDelta")


class HeardAt:
    """A wake stream that hears its word at one sample (the gate's interplay with turns is
    what is tested here; the real model is tests/test_ws_wake.py's)."""

    def __init__(self, sample: int) -> None:
        self.sample = sample
        self.fed = 0

    def process(self, audio: bytes) -> list[Detection]:
        before, self.fed = self.fed, self.fed + len(audio) // 2
        if before <= self.sample < self.fed:
            return [Detection("okay_nabu", self.sample * 1000 // SR, self.sample)]
        return []

    def close(self) -> None:
        pass


@pytest.mark.parametrize("mode", ["asr", "assistant"])
async def test_a_semantic_end_closes_the_wake_gate(asr: WhisperAsr, mode: Mode) -> None:
    """semantic_vad ends "What time is it?" on its text, once its decode is back (here
    after 600 ms of silence, past the 300 ms its text asks for): that is the command's end
    too, so the same question said again, without the word, within wake.command_window_s,
    is not transcribed. Assistant mode: the one command is answered once (its reply made
    at the pause, held back, released)."""
    detection = TurnDetection(type="semantic_vad", eagerness="auto")
    responder = CountingResponder()
    turns = Turns(runtime(asr, responder), StreamConfig(mode=mode, turn_detection=detection))
    listener = turns.session.listener
    assert listener is not None
    listener.wake_gate = WakeGate(HeardAt(SR // 10), command_window_s=8.0)  # type: ignore[arg-type]
    command = fixture_audio("command.wav")
    turns.instant = False
    events = await turns.run(
        silence(0.2), command, silence(0.6), None, silence(1.0), command, silence(1.5)
    )
    assert len(of(events, WakeDetected)) == 1
    (final,) = of(events, TranscriptFinal)
    if mode == "assistant":
        assert isinstance(final, TranscriptFinal) and responder.calls == [final.text]
        assert len(of(events, TtsStart)) == 1 and len(of(events, ResponseText)) == 1


class FailsOnce(FakeAsr):
    """Its first final decode fails (a busy stage, an engine hiccup); then as FakeAsr."""

    failed = False

    def transcribe(self, audio: np.ndarray, **kwargs: Any) -> AsrResult:
        if not kwargs.get("partial") and not self.failed:
            self.failed = True
            raise VoxError(ErrorCode.ENGINE_ERROR, "busy")
        return super().transcribe(audio, **kwargs)


async def test_a_failed_decode_at_the_pause_is_not_the_turn_s_final() -> None:
    """The decode made at the tentative end failed: the turn's final is decoded anew (as
    without speculation), not reported as that failure."""
    rt = fake_runtime(load_settings(log_level="warning"), asr=FailsOnce())
    turns = Turns(rt, StreamConfig(mode="asr", partials=False))
    events = await turns.run(silence(0.2), tone(440.0, 0.8), silence(1.0))
    assert not of(events, ErrorEvent), of(events, ErrorEvent)
    (final,) = of(events, TranscriptFinal)
    assert isinstance(final, TranscriptFinal) and final.text


def release(seconds: float = 0.04, amplitude: float = 0.03) -> np.ndarray:
    """A stop consonant's release: a short burst of noise, too quiet for the (fake) VAD."""
    noise = np.random.default_rng(7).uniform(-1.0, 1.0, int(seconds * SR))
    return (noise * amplitude * 32767).astype(np.int16)


def final_sizes(rt: Runtime) -> list[int]:
    asr = rt.engines.asr
    assert isinstance(asr, FakeAsr)
    return [size for size, partial in asr.calls if not partial]


async def test_a_word_s_release_after_the_vad_s_end_is_in_the_final() -> None:
    """ "... a joke": the VAD's end falls in the k's closure and it hears the release as
    silence (over WebRTC's Opus, silero did). The decode at the pause stops at the VAD's
    end; the turn's final is decoded again with the release ("... a Joe" otherwise)."""
    rt = fake_runtime(load_settings(log_level="warning"))
    turns = Turns(rt, StreamConfig(mode="asr", partials=False))
    lead, speech, closure, burst = silence(0.2), tone(440.0, 0.8), silence(0.08), release()
    events = await turns.run(lead, speech, closure, burst, silence(1.0))
    (end,) = of(events, VadEnd)
    assert isinstance(end, VadEnd) and end.end_ms <= 1000 + 32, end  # ended in the closure
    pause, final = final_sizes(rt)  # the pause's decode, then the final's own
    burst_end_ms = 200 + 800 + 80 + 40
    more = final - pause  # both start where the turn's audio starts
    assert (burst_end_ms - end.end_ms) * SR // 1000 <= more, (pause, final, end)
    assert more <= (burst_end_ms - end.end_ms + 50) * SR // 1000, (pause, final, end)


async def test_a_pause_s_decode_stays_the_final_when_silence_follows() -> None:
    """No sound after the VAD's end: the decode made at the pause is the final (one decode:
    the release's check costs a turn nothing)."""
    rt = fake_runtime(load_settings(log_level="warning"))
    turns = Turns(rt, StreamConfig(mode="asr", partials=False))
    events = await turns.run(silence(0.2), tone(440.0, 0.8), silence(1.0))
    assert len(of(events, TranscriptFinal)) == 1
    assert len(final_sizes(rt)) == 1, final_sizes(rt)

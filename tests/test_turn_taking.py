"""Turn-taking on the real speech engines (silero, whisper tiny.en, the rules responder):
semantic_vad ends a complete sentence sooner than server_vad, a pause after "and" does not
end the turn, and a speculative reply is held back, released once, or withdrawn unseen.

The audio is fed 64 ms (one VAD batch) at a time, and a speculative decode started at a
tentative end is let finish before more audio comes: as if ASR were instant, so where a turn
ends depends on what was said, not on how busy the machine is (no timing in these tests)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

import numpy as np
import pytest

from tests.fakes import SR, FakeTts, silence
from tests.helpers import fixture_audio
from voxserve.config import load_settings
from voxserve.engines.loaded import Engines
from voxserve.engines.responders import RulesResponder
from voxserve.engines.silero_vad import SileroVad
from voxserve.engines.whisper_asr import WhisperAsr
from voxserve.events import (
    Event,
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
from voxserve.runtime import Runtime

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

    async def feed(self, *parts: np.ndarray) -> None:
        audio = np.concatenate(parts).astype(np.int16)
        for i in range(0, audio.size, BATCH):
            chunk = audio[i : i + BATCH]
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
                spec = listener._spec
                if spec is None or spec.task.done():
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

    async def run(self, *parts: np.ndarray) -> list[Event]:
        return await self.run_rest(asyncio.create_task(self.session.run()), *parts)

    async def run_rest(self, running: asyncio.Task[None], *parts: np.ndarray) -> list[Event]:
        """`parts`, the end of input, then the session's end (`running`: its task)."""
        try:
            await self.feed(*parts)
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


class LateTurns(Turns):
    """`feed` without waiting for the decode started at a pause while `late` is set; such
    a decode comes back when `late` is cleared (after the turn's wait, before the longest:
    as on a busy server)."""

    late = False
    back = asyncio.Event()

    def hold_decodes(self) -> None:
        listener = self.session.listener
        assert listener is not None
        recognise = listener._recognise

        async def held(audio: np.ndarray, partial_result: bool) -> object:
            if not partial_result:
                await self.back.wait()
            return await recognise(audio, partial_result=partial_result)

        listener._recognise = held  # type: ignore[method-assign,assignment]

    async def _settle(self) -> None:
        listener = self.session.listener
        assert listener is not None
        if not self.late:
            return await super()._settle()
        while len(listener.ring) >= listener.batch_samples or listener._holder:  # noqa: ASYNC110
            await asyncio.sleep(0.002)


async def test_the_wake_gate_closes_when_a_late_decode_ends_the_command(
    asr: WhisperAsr,
) -> None:
    """An assistant session behind "okay_nabu" with semantic_vad: the command's decode comes
    back after its wait, so that decode ends the turn (not the VAD round); the gate closes
    then too: the words after it, without the wake word, are neither transcribed nor
    answered."""
    import soxr

    from voxserve.engines.micro_wakeword import MicroWakeWordEngine
    from voxserve.engines.piper_tts import PiperTts

    piper = PiperTts()
    word = np.concatenate(list(piper.synthesize("Okay Nabu.", voice="joe"))).astype(np.float32)
    word = (soxr.resample(word / 32768.0, piper.sample_rate, SR) * 32767).astype(np.int16)
    responder = CountingResponder()
    engines = Engines(SileroVad(), asr, [FakeTts()], responder, "fake")
    engines.wake = MicroWakeWordEngine(models=["okay_nabu"])
    rt = Runtime.from_engines(load_settings(log_level="warning"), engines)
    detection = TurnDetection(type="semantic_vad", eagerness="auto")
    turns = LateTurns(
        rt, StreamConfig(mode="assistant", turn_detection=detection, wake_word="okay_nabu")
    )
    running = asyncio.create_task(turns.session.run())
    await turns.feed(silence(0.3), word)
    turns.late = True
    turns.back = asyncio.Event()
    turns.hold_decodes()
    await turns.feed(fixture_audio("command.wav"), silence(0.6))  # its decode at the pause waits
    turns.late = False
    turns.back.set()
    events = await turns.run_rest(running, silence(0.5), fixture_audio("lights.wav"), silence(1.5))
    finals = [e.text for e in of(events, TranscriptFinal) if isinstance(e, TranscriptFinal)]
    assert len(of(events, WakeDetected)) == 1 and len(finals) == 1, finals
    assert "time" in finals[0].lower() and responder.calls == finals, finals

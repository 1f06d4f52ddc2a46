"""The input side of a conversation session (the Realtime API) on the fake engines: turns
committed after VAD's end or at the client's commit (push-to-talk), cleared audio, the
session's own VAD settings and their change while it runs, a failed transcript, and the
hooks the reply side is told through, in the order the events say."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest

from tests.fakes import SR, FakeAsr, FakeTts, FakeVad, fake_runtime, silence, tone
from tests.helpers import fixture_audio, fixture_texts, wer
from tests.transports.test_session_driver import FakeInput
from voxserve.config import Settings, VadConfig, load_settings
from voxserve.engines.loaded import Engines
from voxserve.engines.responders import EchoResponder
from voxserve.engines.silero_vad import SileroVad
from voxserve.engines.whisper_asr import WhisperAsr
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import (
    AudioCleared,
    AudioCommitted,
    ClearAudio,
    CommitAudio,
    ConversationConfig,
    ErrorEvent,
    Event,
    SessionEnded,
    StreamConfig,
    TranscriptFailed,
    TranscriptFinal,
    TranscriptPartial,
    TurnDetection,
    VadEnd,
    VadStart,
    speech_item_id,
)
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.session import Session
from voxserve.pipeline.turns.detection import SpeechEnd, SpeechStart, TurnDetector, session_vad
from voxserve.pipeline.turns.listener import Listener
from voxserve.runtime import Runtime
from voxserve.server.session.attachment import attach
from voxserve.server.session.auth import ANONYMOUS
from voxserve.server.session.driver import SessionDriver
from voxserve.server.session.input import InputEnd, Wire

pytestmark = pytest.mark.timeout(60)

FRAME = 320  # 20 ms at 16 kHz
SERVER_VAD = TurnDetection()
PUSH_TO_TALK = None
# What the input side sends (the reply side's events, ResponseDelta etc., are not these).
INPUT_EVENTS = (
    VadStart,
    VadEnd,
    AudioCommitted,
    AudioCleared,
    TranscriptPartial,
    TranscriptFinal,
    TranscriptFailed,
    ErrorEvent,
)


def settings(**vad: Any) -> Settings:
    base = load_settings(log_level="warning")
    return base.model_copy(update={"vad": base.vad.model_copy(update=vad)})


class Hooks:
    """Records the listener's hooks with how many events were queued when each ran, so a
    test can say where in the event order it came; `previous` is the last item's id."""

    def __init__(self, session: Session) -> None:
        self.outbox = session.outbox
        self.calls: list[tuple[object, ...]] = []
        self.previous: str | None = "item_before"
        listener = session.listener
        assert listener is not None
        listener.on_speech_start = self.speech_start
        listener.on_final = self.final
        listener.on_commit = self.commit
        listener.on_failed = self.failed
        listener.last_item_id = lambda: self.previous

    async def speech_start(self, segment: int) -> None:
        self.calls.append(("speech_start", segment, self.outbox.sent_events))

    async def commit(self, segment: int, audio_ms: int) -> None:
        assert audio_ms > 0  # the turn's speech: its user item's audio (usage)
        self.calls.append(("commit", segment, self.outbox.sent_events))
        self.previous = f"user{segment}"  # as the reply side adds the user item

    async def final(self, segment: int, text: str) -> None:
        self.calls.append(("final", segment, text, self.outbox.sent_events))

    async def failed(self, segment: int, error: VoxError) -> None:
        self.calls.append(("failed", segment, error.code.value, self.outbox.sent_events))


def conversation(
    detection: TurnDetection | None = SERVER_VAD,
    *,
    runtime: Runtime | None = None,
    rate: int = SR,
    partials: bool = False,
) -> tuple[Session, Hooks]:
    runtime = runtime or fake_runtime(settings())
    config = StreamConfig(
        mode="assistant",
        sample_rate=rate,
        partials=partials,
        conversation=ConversationConfig(turn_detection=detection),
    )
    session = Session(runtime.session_context(), config, Outbox(4096))
    return session, Hooks(session)


class Feeder:
    """Feeds a session's audio frame by frame, seq numbers running on."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.seq = 0

    async def feed(self, *parts: np.ndarray, rate: int = SR, pace: bool = False) -> None:
        audio = np.concatenate(parts).astype(np.int16)
        step = rate // 50
        for i in range(0, audio.size, step):
            await self.session.feed_audio(self.seq, memoryview(audio[i : i + step].tobytes()))
            self.seq += 1
            if pace:  # 5x real time at most: partials come (asr.partial_max_speed)
                await asyncio.sleep(0.004)

    async def settle(self) -> None:
        """Until the listener has been through what was fed, but for less than a VAD batch
        (which waits for more audio)."""
        listener = self.session.listener
        assert listener is not None
        async with asyncio.timeout(5):
            while len(listener.ring) >= listener.batch_samples or listener._holder is not None:  # noqa: ASYNC110
                await asyncio.sleep(0.005)


async def run_session(session: Session, script: Any) -> list[Event]:
    """Run `session` through `script(feeder)`, end its input, return its events."""
    running = asyncio.create_task(session.run())
    try:
        await script(Feeder(session))
        await session.end_input()
        await asyncio.wait_for(asyncio.shield(running), 20)
    finally:
        if not running.done():
            running.cancel()
    events: list[Event] = []
    while session.outbox.qsize():
        item = await session.outbox.next()
        if isinstance(item, Event):
            events.append(item)
    assert isinstance(events[-1], SessionEnded)
    return events


def inputs(events: Iterable[Event]) -> list[Event]:
    return [e for e in events if isinstance(e, INPUT_EVENTS)]


def kinds(events: Iterable[Event]) -> list[str]:
    """Each input event as "Type:segment" ("Type:" where it has none)."""
    named = []
    for event in inputs(events):
        segment = getattr(event, "segment", None)
        named.append(f"{type(event).__name__}:{segment if isinstance(segment, int) else ''}")
    return named


def by_turn(events: Iterable[Event]) -> dict[int | None, list[str]]:
    """Each segment's input events in order (None: the events of no segment): a turn's
    final is decoded while the next turn is heard, so turns may interleave."""
    turns: dict[int | None, list[str]] = {}
    for event in inputs(events):
        segment = getattr(event, "segment", None)
        key = segment if isinstance(segment, int) else None
        turns.setdefault(key, []).append(type(event).__name__)
    return turns


VAD_TURN = ["VadStart", "VadEnd", "AudioCommitted", "TranscriptFinal"]
PTT_TURN = ["AudioCommitted", "TranscriptFinal"]


def index_of(events: list[Event], kind: type[Event], segment: int) -> int:
    for i, event in enumerate(events):
        if isinstance(event, kind) and getattr(event, "segment", None) == segment:
            return i
    raise AssertionError(f"no {kind.__name__} for segment {segment}")


def finals(events: Iterable[Event]) -> list[TranscriptFinal]:
    return [e for e in events if isinstance(e, TranscriptFinal)]


# -- the turn detector's session settings (pure) ---------------------------------------------


def test_session_vad_takes_the_sessions_settings_and_the_server_s_for_none() -> None:
    server = VadConfig()
    assert session_vad(server, None) is server and session_vad(server, TurnDetection()) is server
    own = session_vad(server, TurnDetection(0.8, 50, 900))
    assert (own.threshold, own.pad_ms, own.hangover_ms) == (0.8, 50, 900)
    assert own.neg_threshold == pytest.approx(0.8 - (server.threshold - server.neg_threshold))
    assert own.min_speech_ms == server.min_speech_ms
    assert own.max_utterance_s == server.max_utterance_s
    low = session_vad(server, TurnDetection(threshold=0.1))
    assert low.neg_threshold == pytest.approx(0.05)  # half of it, not below zero


def test_a_detector_can_be_tuned_cut_and_dropped_mid_turn() -> None:
    w = 512
    turns = TurnDetector(VadConfig(min_speech_ms=64, hangover_ms=1000), w)
    assert turns.feed([0.9] * 4) == [SpeechStart(0)]
    assert turns.feed([0.0] * 10) == []  # 320 ms: under the 1 s hangover
    turns.tune(VadConfig(min_speech_ms=64, hangover_ms=200))
    assert turns.feed([0.0]) == [SpeechEnd(0, 4 * w)]  # the next window decides
    assert turns.cut() is None  # nothing in progress
    turns.feed([0.9] * 4)
    assert turns.cut() == SpeechEnd(15 * w, 19 * w, forced=True) and not turns.speaking
    turns.feed([0.9] * 4)
    turns.drop()
    assert not turns.speaking and turns.feed([0.0] * 20) == []  # dropped: no end
    turns.restart_at(100 * w)
    assert turns.feed([0.9] * 4) == [SpeechStart(100 * w)]


# -- server VAD ---------------------------------------------------------------------------


async def test_a_vad_turn_is_committed_after_its_end_and_before_its_final() -> None:
    session, hooks = conversation()

    async def script(f: Feeder) -> None:
        await f.feed(silence(0.3), tone(440, 1.0), silence(0.8), tone(880, 1.0), silence(0.8))

    events = await run_session(session, script)
    assert by_turn(events) == {0: VAD_TURN, 1: VAD_TURN}
    committed = [e for e in events if isinstance(e, AudioCommitted)]
    assert [(c.item_id, c.previous_item_id) for c in committed] == [
        (speech_item_id(session.id, 0), "item_before"),
        (speech_item_id(session.id, 1), "user0"),  # the item on_commit added
    ]
    assert [f.text for f in finals(events)] == ["tone440", "tone880"]
    # Each hook where the contract puts it: on_commit right after its AudioCommitted was
    # queued (before the final), on_final after the final.
    for segment in (0, 1):
        start = ("speech_start", segment, index_of(events, VadStart, segment) + 1)
        commit = ("commit", segment, index_of(events, AudioCommitted, segment) + 1)
        assert start in hooks.calls and commit in hooks.calls
        text = finals(events)[segment].text
        assert ("final", segment, text, index_of(events, TranscriptFinal, segment) + 1) in (
            hooks.calls
        )
    assert [c[0] for c in hooks.calls if c[1] == 0] == ["speech_start", "commit", "final"]


async def test_a_stream_session_sends_no_conversation_events() -> None:
    """/v1/stream (no conversation): the same audio, the events it always had."""
    runtime = fake_runtime(settings())
    config = StreamConfig(mode="asr", partials=False)
    session = Session(runtime.session_context(), config, Outbox(4096))

    async def script(f: Feeder) -> None:
        await f.feed(silence(0.3), tone(440, 1.0), silence(0.8))

    events = await run_session(session, script)
    assert [type(e).__name__ for e in events] == [
        "VadStart",
        "VadEnd",
        "TranscriptFinal",
        "SessionEnded",
    ]


async def test_partials_keep_coming_in_a_conversation_session() -> None:
    session, _ = conversation(partials=True)

    async def script(f: Feeder) -> None:
        await f.feed(silence(0.3), tone(440, 2.0), silence(0.8), pace=True)

    events = inputs(await run_session(session, script))
    partial_at = [i for i, e in enumerate(events) if isinstance(e, TranscriptPartial)]
    assert partial_at and all(
        i < index_of(events, VadEnd, 0) for i in partial_at
    )  # never after the turn ended
    assert {e.text for e in events if isinstance(e, TranscriptPartial)} == {"tone440"}


async def test_silence_duration_is_the_sessions_hangover() -> None:
    """A 400 ms pause: one turn under the server's 500 ms hangover, two under 200 ms."""

    async def turns(detection: TurnDetection) -> list[str]:
        session, _ = conversation(detection)

        async def script(f: Feeder) -> None:
            await f.feed(silence(0.3), tone(440, 0.8), silence(0.4), tone(440, 0.8), silence(1))

        return [e.text for e in finals(await run_session(session, script))]

    assert await turns(TurnDetection()) == ["tone440"]
    assert await turns(TurnDetection(silence_duration_ms=200)) == ["tone440", "tone440"]


class LevelVad(FakeVad):
    """Speech probability rises with loudness (FakeVad says 0 or 1), so thresholds count."""

    def speech_probs(self, state: Any, audio: np.ndarray) -> np.ndarray:
        self.calls += 1
        windows = audio.reshape(-1, self.window_samples)
        rms = np.sqrt(np.mean(windows**2, axis=1))
        probs: np.ndarray = np.clip(rms * 2, 0.0, 1.0).astype(np.float32)
        return probs


async def test_the_sessions_threshold_decides_what_is_speech() -> None:
    """A quiet voice (probability ~0.28): not speech at the server's 0.5, speech at 0.2
    (neg_threshold follows it down, so the turn still ends in the silence)."""

    async def turns(detection: TurnDetection) -> list[str]:
        runtime = fake_runtime(settings(), vad=LevelVad())
        session, _ = conversation(detection, runtime=runtime)

        async def script(f: Feeder) -> None:
            await f.feed(silence(0.3), tone(440, 1.0, amplitude=0.2), silence(1.0))

        return [e.text for e in finals(await run_session(session, script))]

    assert await turns(TurnDetection()) == []
    assert await turns(TurnDetection(threshold=0.2)) == ["tone440"]


async def test_prefix_padding_is_the_audio_kept_before_speech() -> None:
    """The final decodes prefix_padding_ms before the speech start (and the server's
    pad_ms after its end)."""

    async def final_samples(prefix_ms: int) -> int:
        asr = FakeAsr()
        session, _ = conversation(
            TurnDetection(prefix_padding_ms=prefix_ms), runtime=fake_runtime(settings(), asr=asr)
        )

        async def script(f: Feeder) -> None:
            await f.feed(silence(1.0), tone(440, 1.0), silence(1.0))

        await run_session(session, script)
        return next(size for size, partial in asr.calls if not partial)

    short, long = await final_samples(0), await final_samples(600)
    assert abs((long - short) - 600 * SR // 1000) <= FakeVad.window_samples


async def test_a_settings_change_applies_from_the_next_decision_and_loses_nothing() -> None:
    """A pause the 1.5 s hangover would sit through: changed to 200 ms while the pause
    runs, the turn ends at once, where the speech stopped; the audio after is a turn too."""
    session, _ = conversation(TurnDetection(silence_duration_ms=1500))
    new = StreamConfig(
        mode="assistant",
        partials=False,
        conversation=ConversationConfig(turn_detection=TurnDetection(silence_duration_ms=200)),
    )

    async def script(f: Feeder) -> None:
        await f.feed(silence(0.3), tone(440, 1.0), silence(0.5))
        await f.settle()
        session.apply_input_update(new)
        await f.feed(silence(0.1), tone(880, 1.0), silence(0.5))

    events = await run_session(session, script)
    assert by_turn(events) == {0: VAD_TURN, 1: VAD_TURN}
    end = next(e for e in events if isinstance(e, VadEnd))
    assert abs(end.end_ms - 1300) <= 40
    assert [e.text for e in finals(events)] == ["tone440", "tone880"]
    assert session.input_config is new


async def test_commit_with_server_vad_ends_the_turn_in_progress_or_is_refused() -> None:
    session, hooks = conversation()

    async def script(f: Feeder) -> None:
        await f.feed(silence(0.5))
        session.commit_audio()  # nothing spoken: refused
        await f.feed(tone(440, 1.0))
        session.commit_audio()  # mid-speech: the turn ends here
        await f.feed(silence(1.0))

    events = inputs(await run_session(session, script))
    assert kinds(events) == [
        "ErrorEvent:",
        "VadStart:0",
        "VadEnd:0",
        "AudioCommitted:0",
        "TranscriptFinal:0",
    ]
    refused = events[0]
    assert isinstance(refused, ErrorEvent)
    assert (refused.code, refused.fatal) == (ErrorCode.EMPTY_AUDIO.value, False)
    end = events[2]
    assert isinstance(end, VadEnd) and abs(end.end_ms - 1500) <= 40  # the commit's point
    assert [c[0] for c in hooks.calls] == ["speech_start", "commit", "final"]


async def test_clear_with_server_vad_drops_the_turn_in_progress() -> None:
    session, hooks = conversation(partials=True)

    async def script(f: Feeder) -> None:
        await f.feed(silence(0.3), tone(440, 1.5), pace=True)
        session.clear_audio()
        await f.feed(silence(0.8), tone(880, 1.0), silence(0.8))

    events = inputs(await run_session(session, script))
    cleared = next(i for i, e in enumerate(events) if isinstance(e, AudioCleared))
    assert [k for k in kinds(events) if not k.startswith("TranscriptPartial")] == [
        "VadStart:0",
        "AudioCleared:",
        "VadStart:1",
        "VadEnd:1",
        "AudioCommitted:1",
        "TranscriptFinal:1",
    ]
    assert not any(isinstance(e, TranscriptPartial) and e.segment == 0 for e in events[cleared:])
    assert [e.text for e in finals(events)] == ["tone880"]
    assert [c[:2] for c in hooks.calls if c[0] != "speech_start"] == [("commit", 1), ("final", 1)]


# -- push-to-talk ---------------------------------------------------------------------------


async def test_push_to_talk_commits_exactly_the_audio_before_each_commit() -> None:
    """No VAD events; each commit is a turn of the audio received before it, even when the
    audio after it is already in the ring (nothing waits between them here)."""
    session, hooks = conversation(PUSH_TO_TALK)

    async def script(f: Feeder) -> None:
        await f.feed(tone(440, 1.0))
        session.commit_audio()
        await f.feed(tone(880, 1.0))
        session.commit_audio()

    events = await run_session(session, script)
    assert by_turn(events) == {0: PTT_TURN, 1: PTT_TURN}
    texts = [(e.text, e.start_ms, e.end_ms) for e in finals(events)]
    assert texts == [("tone440", 0, 1000), ("tone880", 1000, 2000)]
    committed = [e for e in events if isinstance(e, AudioCommitted)]
    assert [c.previous_item_id for c in committed] == ["item_before", "user0"]
    for segment in (0, 1):
        assert [c[0] for c in hooks.calls if c[1] == segment] == ["commit", "final"]
    assert session.ended_event().segments == 2


async def test_an_empty_or_too_short_commit_is_refused_and_keeps_the_audio() -> None:
    session, hooks = conversation(PUSH_TO_TALK)

    async def script(f: Feeder) -> None:
        session.commit_audio()  # nothing at all
        await f.feed(tone(440, 0.06))
        session.commit_audio()  # 60 ms: under the 100 ms a turn takes
        await f.feed(tone(440, 0.94))
        session.commit_audio()

    events = inputs(await run_session(session, script))
    assert kinds(events) == ["ErrorEvent:", "ErrorEvent:", "AudioCommitted:0", "TranscriptFinal:0"]
    for refused in events[:2]:
        assert isinstance(refused, ErrorEvent)
        assert (refused.code, refused.fatal) == ("empty_audio", False)
    final = events[3]
    assert isinstance(final, TranscriptFinal)
    assert (final.text, final.start_ms, final.end_ms) == ("tone440", 0, 1000)  # all of it
    assert [c[0] for c in hooks.calls] == ["commit", "final"]


async def test_clear_drops_the_uncommitted_audio() -> None:
    session, _ = conversation(PUSH_TO_TALK)

    async def script(f: Feeder) -> None:
        await f.feed(tone(440, 1.0))
        session.clear_audio()
        await f.feed(tone(880, 1.0))
        session.commit_audio()

    events = inputs(await run_session(session, script))
    assert kinds(events) == ["AudioCleared:", "AudioCommitted:0", "TranscriptFinal:0"]
    final = events[2]
    assert isinstance(final, TranscriptFinal)
    assert (final.text, final.start_ms, final.end_ms) == ("tone880", 1000, 2000)


async def test_push_to_talk_over_max_utterance_is_committed_not_dropped() -> None:
    """The buffer is bounded as a VAD turn is (vad.max_utterance_s): over it, what is held
    is committed as a turn (AudioCommitted, final), and the audio goes on into the next;
    every sample is in some turn."""
    runtime = fake_runtime(settings(max_utterance_s=2.0))
    session, hooks = conversation(PUSH_TO_TALK, runtime=runtime)

    async def script(f: Feeder) -> None:
        await f.feed(tone(440, 5.0), pace=True)
        await f.settle()
        session.commit_audio()

    events = await run_session(session, script)
    assert by_turn(events) == {0: PTT_TURN, 1: PTT_TURN, 2: PTT_TURN}
    spans = [(e.start_ms, e.end_ms) for e in finals(events)]
    assert spans[0][0] == 0 and spans[-1][1] == 5000
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # contiguous
    assert all(end - start <= 2100 for start, end in spans)
    assert [c[:2] for c in hooks.calls if c[0] == "commit"] == [
        ("commit", 0),
        ("commit", 1),
        ("commit", 2),
    ]


async def test_push_to_talk_commits_what_is_held_at_the_end_of_input() -> None:
    """As VAD's open turn ends with the input, so does push-to-talk's buffer."""
    session, _ = conversation(PUSH_TO_TALK)

    async def script(f: Feeder) -> None:
        await f.feed(tone(440, 1.0))

    events = inputs(await run_session(session, script))
    assert kinds(events) == ["AudioCommitted:0", "TranscriptFinal:0"]


# -- a failed transcript ----------------------------------------------------------------------


class FailingAsr(FakeAsr):
    def transcribe(self, audio: np.ndarray, *, language: str | None = None, partial: bool = False):  # type: ignore[no-untyped-def]
        if not partial:
            raise RuntimeError("fake ASR failure")
        return super().transcribe(audio, language=language, partial=partial)


async def test_a_failed_final_is_transcript_failed_and_on_failed_not_on_final() -> None:
    runtime = fake_runtime(settings(), asr=FailingAsr())
    session, hooks = conversation(PUSH_TO_TALK, runtime=runtime)

    async def script(f: Feeder) -> None:
        await f.feed(tone(440, 1.0))
        session.commit_audio()

    events = await run_session(session, script)
    assert kinds(events) == ["AudioCommitted:0", "TranscriptFailed:0"]
    failed = next(e for e in events if isinstance(e, TranscriptFailed))
    assert failed.item_id == speech_item_id(session.id, 0)
    assert failed.code == ErrorCode.ENGINE_ERROR.value and failed.message
    at = index_of(events, TranscriptFailed, 0) + 1
    assert hooks.calls[-1] == ("failed", 0, "engine_error", at)
    assert not [c for c in hooks.calls if c[0] == "final"]


async def test_a_silent_commit_still_calls_on_final_with_no_text() -> None:
    """A conversation's turn item is done even when nothing was said: on_final("")."""
    session, hooks = conversation(PUSH_TO_TALK)

    async def script(f: Feeder) -> None:
        await f.feed(silence(0.5))
        session.commit_audio()

    events = await run_session(session, script)
    assert [e.text for e in finals(events)] == [""]
    assert [c[:-1] for c in hooks.calls] == [("commit", 0), ("final", 0, "")]


# -- switching turn detection, and the rest of session.update --------------------------------


def with_detection(
    session: Session, detection: TurnDetection | None, **changes: Any
) -> StreamConfig:
    old = session.input_config
    assert old.conversation is not None
    conv = ConversationConfig(
        responds=old.conversation.responds,
        turn_detection=detection,
        transcribe=old.conversation.transcribe,
        response=old.conversation.response,
    )
    fields = {
        "mode": old.mode,
        "sample_rate": old.sample_rate,
        "language": old.language,
        "partials": old.partials,
        "conversation": conv,
    } | changes
    return StreamConfig(**fields)


async def test_switching_vad_off_mid_turn_ends_the_turn_as_silence_would() -> None:
    session, _ = conversation()

    async def script(f: Feeder) -> None:
        await f.feed(silence(0.3), tone(440, 1.0))
        session.apply_input_update(with_detection(session, PUSH_TO_TALK))
        await f.feed(silence(0.2), tone(880, 1.0))
        session.commit_audio()

    events = await run_session(session, script)
    assert by_turn(events) == {0: VAD_TURN, 1: PTT_TURN}
    assert [e.text for e in finals(events)] == ["tone440", "tone880"]
    assert session.listener is not None and not session.listener.detecting


async def test_switching_vad_on_judges_the_audio_not_yet_committed() -> None:
    session, _ = conversation(PUSH_TO_TALK)

    async def script(f: Feeder) -> None:
        await f.feed(silence(0.3), tone(440, 1.0), silence(0.8))
        session.apply_input_update(with_detection(session, SERVER_VAD))
        await f.feed(tone(880, 1.0), silence(0.8))

    events = await run_session(session, script)
    assert by_turn(events) == {0: VAD_TURN, 1: VAD_TURN}
    assert [e.text for e in finals(events)] == ["tone440", "tone880"]
    first = next(e for e in events if isinstance(e, VadStart))
    assert abs(first.start_ms - 300) <= 40  # judged where it was, not where VAD came on


async def test_a_sample_rate_change_restarts_the_resampler_and_keeps_the_audio() -> None:
    """24 kHz PCM, then 8 kHz (G.711's rate) from the update on."""
    session, _ = conversation(PUSH_TO_TALK, rate=24_000)

    async def script(f: Feeder) -> None:
        await f.feed(tone(440, 1.0, rate=24_000), rate=24_000)
        session.apply_input_update(with_detection(session, PUSH_TO_TALK, sample_rate=8_000))
        session.commit_audio()
        await f.feed(tone(880, 1.0, rate=8_000), rate=8_000)
        session.commit_audio()

    events = await run_session(session, script)
    spoken = [(e.text, e.end_ms - e.start_ms) for e in finals(events)]
    assert [text for text, _ in spoken] == ["tone440", "tone880"]
    assert all(abs(duration - 1000) <= 15 for _, duration in spoken), spoken
    assert session.input_config.sample_rate == 8_000


async def test_what_cannot_change_is_refused_and_nothing_changes() -> None:
    session, _ = conversation()
    before = session.config
    bad = [
        (with_detection(session, PUSH_TO_TALK, language="xx"), ErrorCode.UNKNOWN_LANGUAGE),
        (
            with_detection(session, PUSH_TO_TALK, sample_rate=11_025),
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
        ),
        (with_detection(session, PUSH_TO_TALK, mode="asr"), ErrorCode.INVALID_PARAMETER),
        (StreamConfig(mode="assistant"), ErrorCode.INVALID_PARAMETER),  # no conversation
    ]
    listener = session.listener
    assert listener is not None
    for config, code in bad:
        with pytest.raises(VoxError) as refused:
            session.check_input_update(config)
        assert refused.value.code is code
        with pytest.raises(VoxError) as refused:
            session.apply_input_update(config)
        assert refused.value.code is code and not refused.value.fatal
    assert session.input_config is before and listener.detecting and not listener._controls
    session.apply_input_update(with_detection(session, SERVER_VAD, language="en"))
    assert session.language == listener.language == "en"
    session.release()


# -- through the session driver -------------------------------------------------------------


def frames_of(audio: np.ndarray, first_seq: int) -> list[tuple[int, memoryview]]:
    return [
        (first_seq + i, memoryview(audio[j : j + FRAME].astype(np.int16).tobytes()))
        for i, j in enumerate(range(0, audio.size, FRAME))
    ]


async def drive(config: StreamConfig, messages: list[object]) -> list[Event]:
    """A session driver fed `messages` by a scripted connection, to the end of input."""
    runtime = fake_runtime(settings())
    wire = Wire("ws", in_band_end=True, stalls=True, tasks="test")
    driver = SessionDriver.open(runtime, lambda: config, wire=wire, principal=ANONYMOUS)
    source = FakeInput()
    try:
        driver.start()
        async with attach(driver, source, since=time.monotonic()) as attachment:
            for message in messages:
                source.messages.put_nowait(message)
            source.messages.put_nowait(InputEnd.CLOSED)
            assert attachment.receiver is not None
            await asyncio.wait_for(attachment.receiver, 5)
            assert driver.pipeline is not None
            await asyncio.wait_for(asyncio.shield(driver.pipeline), 10)
        outbox, events = driver.session.outbox, list[Event]()
        while outbox.qsize():
            item = outbox._queue.get_nowait()
            if isinstance(item, Event):
                events.append(item)
        return events
    finally:
        driver.close()


async def test_commit_and_clear_through_the_driver() -> None:
    config = StreamConfig(
        mode="assistant",
        partials=False,
        conversation=ConversationConfig(responds=False, turn_detection=PUSH_TO_TALK),
    )
    events = await drive(
        config,
        [
            CommitAudio(),  # nothing yet: refused, not fatal
            frames_of(tone(660, 0.5), 0),
            ClearAudio(),
            frames_of(tone(440, 1.0), 25),
            CommitAudio(),
        ],
    )
    assert kinds(events) == [
        "ErrorEvent:",
        "AudioCleared:",
        "AudioCommitted:0",
        "TranscriptFinal:0",
    ]
    final = finals(events)[0]
    assert (final.text, final.start_ms, final.end_ms) == ("tone440", 500, 1500)
    assert isinstance(events[-1], SessionEnded) and events[-1].reason == "completed"


async def test_a_stream_session_refuses_commit_and_clear_as_wrong_mode() -> None:
    events = await drive(StreamConfig(mode="asr", partials=False), [CommitAudio(), ClearAudio()])
    refused = [e for e in events if isinstance(e, ErrorEvent)]
    assert [(e.code, e.fatal) for e in refused] == [("wrong_mode", False)] * 2
    assert not [e for e in events if isinstance(e, AudioCommitted | AudioCleared)]


def test_a_stream_session_s_listener_has_no_conversation_hooks() -> None:
    """/v1/stream sessions report no commits (the conversation's hooks are tested with its
    responses, tests/test_conversation_replies.py)."""
    runtime = fake_runtime(settings())
    stream = Session(runtime.session_context(), StreamConfig(mode="assistant"), Outbox(8))
    plain = stream.listener
    assert isinstance(plain, Listener)
    assert (plain.on_commit, plain.on_failed, plain.last_item_id) == (None, None, None)
    stream.release()


# -- the real engines ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_engines() -> Engines:
    """silero + whisper (the embedded defaults); a fake TTS: these tests are about input."""
    return Engines(
        vad=SileroVad(),
        asr=WhisperAsr(),
        tts=[FakeTts()],
        responder=EchoResponder(),
        default_voice="fake",
    )


async def test_real_push_to_talk_commit_is_transcribed(real_engines: Engines) -> None:
    """A spoken fixture, committed by the client with turn detection off, gets its final
    transcript (and no VAD events)."""
    runtime = Runtime.from_engines(settings(), real_engines)
    session, hooks = conversation(PUSH_TO_TALK, runtime=runtime)

    async def script(f: Feeder) -> None:
        await f.feed(silence(0.2), fixture_audio("weather.wav"), silence(0.3))
        session.commit_audio()

    events = await run_session(session, script)
    assert by_turn(events) == {0: PTT_TURN}
    final = finals(events)[0]
    assert wer(fixture_texts()["weather.wav"], final.text) <= 0.25, final.text
    assert [c[:2] for c in hooks.calls] == [("commit", 0), ("final", 0)]
    assert hooks.calls[-1][2] == final.text


async def test_real_vad_turn_is_committed_with_the_sessions_settings(
    real_engines: Engines,
) -> None:
    """silero with the session's own threshold and silence duration: the spoken fixture
    is one turn, committed after its end, transcribed."""
    runtime = Runtime.from_engines(settings(), real_engines)
    detection = TurnDetection(threshold=0.6, prefix_padding_ms=300, silence_duration_ms=700)
    session, _ = conversation(detection, runtime=runtime)

    async def script(f: Feeder) -> None:
        await f.feed(silence(0.5), fixture_audio("lights.wav"), silence(1.5), pace=True)

    events = await run_session(session, script)
    assert by_turn(events) == {0: VAD_TURN}
    final = finals(events)[0]
    assert wer(fixture_texts()["lights.wav"], final.text) <= 0.25, final.text

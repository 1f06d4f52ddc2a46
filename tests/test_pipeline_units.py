"""Pure pipeline pieces: turn detection, sentence splitting, the wire parser, stage limits."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from tests.fakes import FakeVad
from tests.helpers import PeakConcurrency
from voxserve.config import VadConfig
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.scheduling.executor import AdaptiveExecutor
from voxserve.pipeline.scheduling.stage import EngineStage
from voxserve.pipeline.turns.detection import SpeechEnd, SpeechStart, TurnDetector
from voxserve.server.session.stream_protocol import (
    CancelMessage,
    EndMessage,
    StartMessage,
    TextMessage,
    parse_audio_frame,
    parse_text_message,
)
from voxserve.text import SentenceBuffer, split_sentences

W = 512  # samples per VAD window (32 ms)


def detector(**kw: object) -> TurnDetector:
    return TurnDetector(VadConfig(**kw), W)  # type: ignore[arg-type]


def test_speech_is_confirmed_after_min_speech_and_back_dated() -> None:
    turns = detector(min_speech_ms=200, hangover_ms=500)
    assert turns.feed([0.0] * 5) == []
    events = turns.feed([0.9] * 7)  # 224 ms of speech
    assert events == [SpeechStart(5 * W)]
    events = turns.feed([0.1] * 16)  # 512 ms of silence ends it
    assert events == [SpeechEnd(5 * W, 12 * W)]


def test_a_cough_is_not_speech() -> None:
    turns = detector(min_speech_ms=200)
    assert turns.feed([0.9, 0.9, 0.1, 0.1, 0.1, 0.1] + [0.0] * 20) == []
    assert not turns.speaking


def test_short_dips_do_not_end_speech() -> None:
    turns = detector(min_speech_ms=64, hangover_ms=500)
    turns.feed([0.9] * 5)
    assert turns.feed(([0.1] * 5 + [0.9] * 3) * 4) == []
    assert turns.speaking


def test_max_utterance_cuts_and_continues() -> None:
    turns = detector(min_speech_ms=64, max_utterance_s=1.0)
    events = turns.feed([0.9] * 40)
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["SpeechStart", "SpeechEnd", "SpeechStart"]
    assert isinstance(events[1], SpeechEnd) and events[1].forced


def test_flush_closes_open_speech() -> None:
    turns = detector(min_speech_ms=64)
    turns.feed([0.9] * 5)
    assert turns.flush() == [SpeechEnd(0, 5 * W, forced=True)]


def test_sentences_split_as_text_streams() -> None:
    assert split_sentences("Hello there. How are") == (["Hello there."], "How are")
    assert split_sentences("Dr. Smith is in. Yes!") == (["Dr. Smith is in."], "Yes!")
    buffer = SentenceBuffer()
    assert buffer.push("It is ten") == []
    assert buffer.push(" past three. And") == ["It is ten past three."]
    assert buffer.flush() == "And" and buffer.flush() is None


def test_wire_parser_messages() -> None:
    start = parse_text_message(
        '{"type":"session.start","mode":"asr","sample_rate":48000,"trace_id":"abc-1"}', 4096
    )
    assert isinstance(start, StartMessage)
    assert start.config.sample_rate == 48000 and start.config.trace_id == "abc-1"
    assert parse_text_message('{"type":"text","text":"hi","flush":true}', 4096) == TextMessage(
        "hi", True
    )
    assert isinstance(parse_text_message('{"type":"audio.end"}', 4096), EndMessage)
    assert isinstance(parse_text_message('{"type":"cancel"}', 4096), CancelMessage)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("nope", ErrorCode.INVALID_JSON),
        ("42", ErrorCode.INVALID_JSON),
        ('{"text":"x"}', ErrorCode.INVALID_MESSAGE),
        ('{"type":"text","text":5}', ErrorCode.INVALID_MESSAGE),
        ('{"type":"text","text":"x","flush":"yes"}', ErrorCode.INVALID_MESSAGE),
        ('{"type":"session.start","mode":"asr","speed":true}', ErrorCode.INVALID_MESSAGE),
        ('{"type":"session.start","mode":"asr","trace_id":"bad id!"}', ErrorCode.INVALID_MESSAGE),
        (
            '{"type":"session.start","mode":"asr","output_sample_rate":11025}',
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
        ),
        ('{"type":"session.start"}', ErrorCode.UNKNOWN_MODE),
        ('{"type":"text","text":"' + "x" * 100 + '"}', ErrorCode.MESSAGE_TOO_LARGE),
    ],
)
def test_wire_parser_errors(raw: str, code: ErrorCode) -> None:
    with pytest.raises(VoxError) as err:
        parse_text_message(raw, 64)
    assert err.value.code is code and err.value.message


def test_audio_frame_header() -> None:
    seq, pcm = parse_audio_frame(b"\x00\x00\x01\x02" + b"\x01\x00" * 320, 16000, 200)
    assert seq == 258 and len(pcm) == 640
    for data, code in [
        (b"\x00", ErrorCode.FRAME_TOO_SHORT),
        (b"\x00" * 4, ErrorCode.EMPTY_AUDIO),
        (b"\x00" * 5, ErrorCode.ODD_LENGTH_PCM),
        (b"\x00" * (4 + 6402), ErrorCode.FRAME_TOO_LARGE),
    ]:
        with pytest.raises(VoxError) as err:
            parse_audio_frame(data, 16000, 200)
        assert err.value.code is code


async def test_stage_limits_concurrency_and_names_its_errors() -> None:
    executor = AdaptiveExecutor(min_workers=1, max_workers=8, idle_release_s=30)
    stage = EngineStage("asr", concurrency=2, timeout_s=5.0, executor=executor)
    work = PeakConcurrency(0.05)
    results = await asyncio.gather(*(stage.run(work) for _ in range(8)))
    assert results == [1] * 8 and work.peak == 2

    def boom() -> None:
        raise RuntimeError("model exploded")

    with pytest.raises(VoxError) as err:
        await stage.run(boom)
    assert err.value.code is ErrorCode.ENGINE_ERROR and err.value.stage == "asr"
    executor.shutdown()


async def test_stage_timeout_keeps_the_slot_until_work_really_ends() -> None:
    executor = AdaptiveExecutor(min_workers=1, max_workers=4, idle_release_s=30)
    stage = EngineStage("tts", concurrency=1, timeout_s=0.05, executor=executor)
    with pytest.raises(VoxError) as err:
        await stage.run(time.sleep, 0.3)
    assert err.value.code is ErrorCode.STAGE_TIMEOUT and err.value.stage == "tts"
    assert stage.running == 1  # the abandoned call still occupies its slot
    # A queued call behind it is withdrawn when its own deadline passes: it never runs.
    ran = threading.Event()
    with pytest.raises(VoxError):
        await stage.run(ran.set)
    await asyncio.sleep(0.4)
    assert stage.running == 0 and not ran.is_set()
    executor.shutdown()


class CountingVad(FakeVad):
    """A FakeVad with a batched path that records each batch's size (and can take time)."""

    def __init__(self, busy_s: float = 0.0) -> None:
        super().__init__()
        self.busy_s = busy_s
        self.many_calls: list[int] = []

    def speech_probs_many(self, states: list[object], audios: list[np.ndarray]) -> list[object]:
        self.many_calls.append(len(audios))
        time.sleep(self.busy_s)
        return [self.speech_probs(s, a) for s, a in zip(states, audios, strict=True)]


async def test_vad_batcher_gathers_sessions_into_one_engine_call() -> None:
    from voxserve.pipeline.scheduling.vad_batch import VadBatcher

    executor = AdaptiveExecutor(min_workers=1, max_workers=2, idle_release_s=30)
    vad = CountingVad()
    stage = EngineStage("vad", concurrency=1, timeout_s=2.0, executor=executor)
    batcher = VadBatcher(vad, stage, max_wait_ms=20, max_batch=64)
    loud = np.full(1024, 0.5, dtype=np.float32)
    quiet = np.zeros(1024, dtype=np.float32)
    calls = [batcher.speech_probs({}, loud if i % 2 else quiet) for i in range(10)]
    doomed = asyncio.ensure_future(batcher.speech_probs({}, loud))
    await asyncio.sleep(0)
    doomed.cancel()  # a session that left before its batch ran: skipped, others unaffected
    results = await asyncio.gather(*calls)
    assert vad.many_calls == [10]
    assert [r.tolist() for r in results] == [[0.0, 0.0], [1.0, 1.0]] * 5
    batcher.close()
    executor.shutdown()


async def test_asr_batcher_runs_concurrent_finals_as_one_engine_batch() -> None:
    from tests.fakes import FakeAsr, tone
    from voxserve.audio.pcm import to_float32
    from voxserve.pipeline.scheduling.asr_batch import AsrBatcher
    from voxserve.types import AsrResult

    class BatchingAsr(FakeAsr):
        def __init__(self) -> None:
            super().__init__()
            self.batches: list[int] = []

        def transcribe_many(
            self, audios: list[np.ndarray], *, language: str | None = None, partial: bool = False
        ) -> list[AsrResult]:
            self.batches.append(len(audios))
            return [self.transcribe(a, language=language, partial=partial) for a in audios]

    executor = AdaptiveExecutor(min_workers=1, max_workers=2, idle_release_s=30)
    asr = BatchingAsr()
    stage = EngineStage("asr", concurrency=1, timeout_s=5.0, executor=executor)
    batcher = AsrBatcher(asr, stage, max_wait_ms=30, max_batch=4)
    sizes: list[tuple[str, int]] = []
    batcher.on_batch = lambda engine, size: sizes.append((engine, size))
    freqs = [300, 400, 500, 600, 700, 800]
    clips = [to_float32(tone(f, 0.5)) for f in freqs]
    results = await asyncio.gather(*(batcher.final(c, "en", deadline=None) for c in clips))
    assert [r.text for r in results] == [f"tone{f}" for f in freqs]  # each its own, in order
    assert sorted(asr.batches) == [2, 4]  # bounded by max_batch, nothing run twice
    assert sorted(sizes) == [("asr", 2), ("asr", 4)]
    batcher.close()
    executor.shutdown()


class _Job:
    """A VadJob with fixed audio, recording its answer (and optionally failing to give one)."""

    def __init__(self, audio: object, *, broken: bool = False) -> None:
        self.audio = audio
        self.broken = broken
        self.answers: list[tuple[object, BaseException | None]] = []
        self.answered = asyncio.Event()

    def vad_input(self) -> tuple[object, object] | None:
        if self.broken:
            raise RuntimeError("this stream's state is broken")
        return None if self.audio is None else ({}, self.audio)

    def vad_result(self, probs: object, error: BaseException | None) -> None:
        self.answers.append((None if probs is None else probs.tolist(), error))  # type: ignore[attr-defined]
        self.answered.set()


async def test_vad_rounds_judge_every_due_stream_in_one_engine_call() -> None:
    """Listeners enqueued together are judged in one engine call and answered in place; a
    stream that fails to give its audio, or has none, is answered alone; streams that
    become due during a round go together in the next."""
    from voxserve.pipeline.scheduling.vad_batch import VadBatcher

    executor = AdaptiveExecutor(min_workers=1, max_workers=2, idle_release_s=30)
    vad = CountingVad(busy_s=0.05)  # busy long enough for others to queue behind a round
    stage = EngineStage("vad", concurrency=2, timeout_s=2.0, executor=executor)
    batcher = VadBatcher(vad, stage, max_wait_ms=0, max_batch=4)
    sizes: list[int] = []
    batcher.on_batch = lambda engine, size: sizes.append(size)
    loud = np.full(1024, 0.5, dtype=np.float32)
    quiet = np.zeros(1024, dtype=np.float32)
    first = [_Job(loud if i % 2 else quiet) for i in range(6)]
    odd = [_Job(None), _Job(loud, broken=True)]
    for job in first + odd:
        batcher.enqueue(job)
    await asyncio.sleep(0.02)  # the first round is in the engine now
    later = [_Job(loud) for _ in range(3)]
    for job in later:
        batcher.enqueue(job)
    assert stage.waiting == 1  # held behind the running round: one engine call's worth
    await asyncio.wait_for(asyncio.gather(*(j.answered.wait() for j in first + odd + later)), 5)
    # max_batch 4 (two calls at once: the stage runs two), then the next round
    assert sorted(vad.many_calls[:2]) == [2, 4] and vad.many_calls[2:] == [3]
    assert sizes == [4, 2, 3]
    assert [j.answers for j in first] == [[([0.0, 0.0], None)], [([1.0, 1.0], None)]] * 3
    assert odd[0].answers == [(None, None)]
    ((probs, error),) = odd[1].answers
    assert probs is None and isinstance(error, RuntimeError)
    assert all(j.answers == [([1.0, 1.0], None)] for j in later)
    assert stage.waiting == 0
    batcher.close()
    executor.shutdown()


async def test_vad_round_failure_is_retried_alone_so_only_the_culprit_fails() -> None:
    from voxserve.pipeline.scheduling.vad_batch import VadBatcher

    class PoisonedVad(FakeVad):
        def speech_probs(self, state: object, audio: np.ndarray) -> np.ndarray:
            if audio.size == 512:
                raise RuntimeError("this input breaks the model")
            return super().speech_probs(state, audio)

    executor = AdaptiveExecutor(min_workers=1, max_workers=2, idle_release_s=30)
    stage = EngineStage("vad", concurrency=2, timeout_s=2.0, executor=executor)
    batcher = VadBatcher(PoisonedVad(), stage, max_wait_ms=0, max_batch=8)
    good = [_Job(np.zeros(1024, dtype=np.float32)) for _ in range(3)]
    bad = _Job(np.zeros(512, dtype=np.float32))
    for job in [good[0], bad, *good[1:]]:
        batcher.enqueue(job)
    await asyncio.wait_for(asyncio.gather(*(j.answered.wait() for j in [*good, bad])), 5)
    assert all(j.answers == [([0.0, 0.0], None)] for j in good)
    ((probs, error),) = bad.answers
    assert probs is None and isinstance(error, VoxError) and error.code is ErrorCode.ENGINE_ERROR
    batcher.close()
    executor.shutdown()

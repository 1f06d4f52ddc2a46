"""Real Whisper through the AsrBatcher (finals held while the engine is busy run as one
batch): every result is what the engine gives that audio alone. Also the 30 s redo rule and
the BLAS thread cap the engine sets."""

from __future__ import annotations

import asyncio
import ctypes

import numpy as np
import pytest

from tests.engines.conftest import load_fixture
from voxserve.engines.blas import _loaded_openblas
from voxserve.engines.whisper_asr import TIME_PRECISION_S, WhisperAsr, _Decoded
from voxserve.pipeline.scheduling.asr_batch import AsrBatcher
from voxserve.pipeline.scheduling.executor import AdaptiveExecutor
from voxserve.pipeline.scheduling.stage import EngineStage, deadline_in
from voxserve.types import SAMPLE_RATE


async def test_held_finals_batch_and_equal_one_at_a_time(asr: WhisperAsr) -> None:
    names = ["command.wav", "lights.wav", "weather.wav", "reminder.wav", "two_turns.wav"]
    audios = [load_fixture(n) for n in names]
    gap = np.zeros(SAMPLE_RATE // 2, dtype=np.float32)
    audios.append(np.concatenate([load_fixture("long.wav"), gap, load_fixture("weather.wav")]))
    audios.append(np.zeros(8000, dtype=np.float32))  # silence among them
    assert asr.window_for(audios[-2].size / SAMPLE_RATE) == 20  # a second window in the batch
    alone = [asr.transcribe(a) for a in audios]

    executor = AdaptiveExecutor(min_workers=1, max_workers=2, idle_release_s=30)
    stage = EngineStage("asr", concurrency=2, timeout_s=30.0, executor=executor)
    batcher = AsrBatcher(asr, stage, max_wait_ms=0, max_batch=8)
    assert batcher.max_inflight == 1  # CTranslate2 runs one call at a time (num_workers=1)
    sizes: list[int] = []
    batcher.on_batch = lambda _engine, size: sizes.append(size)
    first = asyncio.ensure_future(batcher.final(audios[0], "en", deadline=deadline_in(0.3)))
    await asyncio.sleep(0.01)  # the first final is running; the others end meanwhile
    rest = [batcher.final(a, "en", deadline=deadline_in(0.3)) for a in audios[1:]]
    batched = await asyncio.gather(first, *rest)
    assert batched == alone
    assert sizes == [1, len(audios) - 1]
    batcher.close()
    executor.shutdown()


def _ts(asr: WhisperAsr, seconds: float) -> int:
    return asr._ts_begin + round(seconds / TIME_PRECISION_S)


def _decoded(tokens: list[int]) -> _Decoded:
    return _Decoded(tokens=tokens, avg_logprob=-0.2, no_speech_prob=0.01, hit_cap=False)


@pytest.fixture(scope="module")
def asr_redo_late_end() -> WhisperAsr:
    return WhisperAsr(redo_late_end=True)


def test_redo_rule_text_past_the_audio(asr: WhisperAsr, asr_redo_late_end: WhisperAsr) -> None:
    words = asr._tokenizer.encode(" What time is it?")
    late_close = _decoded([_ts(asr, 0.0), *words, _ts(asr, 23.4)])
    # A closing timestamp past a 2.6 s utterance: clipped, not redone (unless asked to).
    assert not asr._anomalous(late_close, 2.6)
    assert asr_redo_late_end._anomalous(late_close, 2.6)
    # Text that starts after the audio ended is made up: redone with the 30 s window.
    made_up = _decoded([_ts(asr, 0.0), *words, _ts(asr, 2.0), _ts(asr, 5.0), *words])
    assert asr._anomalous(made_up, 2.6)
    fine = _decoded([_ts(asr, 0.0), *words, _ts(asr, 2.4)])
    assert not asr._anomalous(fine, 2.6) and not asr_redo_late_end._anomalous(fine, 2.6)


def test_numpy_blas_runs_one_thread(asr: WhisperAsr) -> None:
    """Whisper's features use numpy's BLAS; a pool per core would spin beside the engine."""
    libs = _loaded_openblas()
    if not libs:
        pytest.skip("numpy is not linked against OpenBLAS here")
    lib = ctypes.CDLL(libs[0])
    getter = getattr(lib, "scipy_openblas_get_num_threads64_", None) or getattr(
        lib, "openblas_get_num_threads", None
    )
    if getter is None:
        pytest.skip("no OpenBLAS thread getter")
    assert getter() == 1

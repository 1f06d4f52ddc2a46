"""The `load` engines: the engine protocols, energy VAD, fixed ASR text, tone TTS, and a
CPU cost that is really spent."""

from __future__ import annotations

import time

import numpy as np
import pytest

from voxserve.engines.base import AsrEngine, TtsEngine, VadEngine
from voxserve.engines.load import LoadAsr, LoadTts, LoadVad, burn
from voxserve.engines.registry import engine_class


def test_entry_points_and_protocols() -> None:
    assert engine_class("vad", "load") is LoadVad
    assert engine_class("asr", "load") is LoadAsr
    assert engine_class("tts", "load") is LoadTts
    assert isinstance(LoadVad(), VadEngine)
    assert isinstance(LoadAsr(), AsrEngine)
    assert isinstance(LoadTts(), TtsEngine)


def test_vad_is_energy_based() -> None:
    vad = LoadVad()
    state = vad.new_state()
    loud = np.full(512, 0.1, dtype=np.float32)
    silent = np.zeros(512, dtype=np.float32)
    probs = vad.speech_probs(state, np.concatenate([loud, silent, loud]))
    assert probs.tolist() == [1.0, 0.0, 1.0]
    assert state["windows"] == 3
    vad.reset_state(state)
    assert state["windows"] == 0


def test_asr_returns_the_configured_text_for_speech() -> None:
    asr = LoadAsr(text="hello world")
    assert asr.transcribe(np.full(1600, 0.1, dtype=np.float32)).text == "hello world"
    assert asr.transcribe(np.zeros(1600, dtype=np.float32)).text == ""
    assert asr.languages == ("en",)


def test_tts_length_is_proportional_to_text() -> None:
    tts = LoadTts(ms_per_char=50, chunk_ms=100)
    assert [v.id for v in tts.voices()] == ["load"]
    chunks = list(tts.synthesize("x" * 10, voice="load"))  # 500 ms
    assert [c.size for c in chunks] == [1600] * 5
    assert sum(c.size for c in tts.synthesize("x" * 10, voice="load", speed=2.0)) == 4000
    with pytest.raises(ValueError):
        list(tts.synthesize("hi", voice="joe"))


def test_costs_are_spent() -> None:
    asr = LoadAsr(cpu_ms_per_call=30)
    started = time.thread_time()
    asr.transcribe(np.zeros(160, dtype=np.float32))
    assert time.thread_time() - started >= 0.03
    vad = LoadVad(sleep_ms=20)
    began = time.perf_counter()
    vad.speech_probs(vad.new_state(), np.zeros(512, dtype=np.float32))
    assert time.perf_counter() - began >= 0.02
    started = time.thread_time()
    burn(0.01, hold_gil=True)
    assert time.thread_time() - started >= 0.01
    with pytest.raises(ValueError):
        LoadVad(sleep_ms=-1)


def test_vad_holds_speech_over_a_short_gap_as_a_trained_vad_does() -> None:
    """hold_ms 64 (two windows): a gap of two quiet windows between loud ones stays speech
    (no pause, so no speculative decode), a longer one ends after the hold, also across
    calls; reset starts quiet."""
    vad = LoadVad(hold_ms=64)
    state = vad.new_state()
    loud = np.full(512, 0.1, dtype=np.float32)
    quiet = np.zeros(512, dtype=np.float32)
    probs = vad.speech_probs(state, np.concatenate([quiet, loud, quiet, quiet, loud, quiet]))
    assert probs.tolist() == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    (more,) = vad.speech_probs_many([state], [np.concatenate([quiet, quiet, loud])])
    assert more.tolist() == [1.0, 0.0, 1.0]  # the hold spans the calls: 2 quiet, then silence
    vad.reset_state(state)
    assert vad.speech_probs(state, quiet).tolist() == [0.0]
    with pytest.raises(ValueError):
        LoadVad(hold_ms=-1)

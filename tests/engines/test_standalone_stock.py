"""The benchmark's standalone figures for Whisper as shipped (faster-whisper's own
`transcribe`, 30 s windows) beside the server's engine, on the same cuts of real recordings."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.engines.conftest import FIXTURES
from voxserve.bench.program import build, fixture_clips
from voxserve.bench.standalone import (
    measure_asr,
    measure_asr_stock,
    measure_tts,
    measure_tts_stock,
)
from voxserve.config import Settings
from voxserve.engines.piper_tts import PiperTts
from voxserve.engines.whisper_asr import WhisperAsr


def test_stock_whisper_costs_more_per_final_than_the_bucketed_engine(asr: WhisperAsr) -> None:
    # One short utterance: the stock 30 s window is the cost (two took 16 s on a busy box).
    clips = [c for c in fixture_clips(Path(FIXTURES)) if c[0].size < 16000 * 5][:1]
    program = build(clips, gap_s=1.0)
    engines = SimpleNamespace(asr=asr)
    settings = Settings()
    stock = measure_asr_stock(engines, program, settings)
    assert stock is not None and stock["utterances"] == len(program.utterances) == 1
    ours = measure_asr(engines, program, settings, chunk_ms=640, partials=False)
    # Short utterances: the 30 s window costs several times the 10 s bucket.
    assert stock["cpu_ms_per_utterance"] > 2 * ours["cpu_ms_per_utterance"], (stock, ours)
    assert measure_asr_stock(SimpleNamespace(asr=object()), program, settings) is None


def test_stock_piper_speaks_the_same_texts(piper: PiperTts) -> None:
    """piper as shipped (its own load and synthesize) beside the server's piper engine:
    the same voice, so about as much speech for the same texts."""
    texts = ["Please turn on the lights in the kitchen."]
    engines = SimpleNamespace(voice=lambda _id: (piper.voices()[0], piper))
    stock = measure_tts_stock(engines, texts)
    ours = measure_tts(engines, texts)
    assert stock is not None and stock["first_audio_ms"]["count"] == len(texts)
    ratio = ours["audio_s"] / stock["audio_s"]
    assert 0.8 < ratio < 1.25, (stock, ours)  # same speech, sampled noise aside
    espeak_like = SimpleNamespace(voice=lambda _id: (None, object()))
    assert measure_tts_stock(espeak_like, texts) is None

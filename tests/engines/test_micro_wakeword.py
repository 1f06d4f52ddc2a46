"""The microWakeWord engine on the real models, spoken to by piper `joe`: what it hears
matches the pymicro-wakeword package's own detector, streams keep their own state, one
utterance fires once (refractory period), and a bad wake setting stops `serve` at start."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import soxr
from pydantic import ValidationError

from tests.test_cli import assert_one_error_line, clean_env, run_cli
from voxserve.config import WakeConfig
from voxserve.engines.micro_wakeword import MicroWakeWordEngine
from voxserve.engines.piper_tts import PiperTts
from voxserve.types import SAMPLE_RATE


@pytest.fixture(scope="module")
def engine() -> MicroWakeWordEngine:
    return MicroWakeWordEngine()


def say(piper: PiperTts, text: str, pad_s: float = 0.5) -> bytes:
    audio = np.concatenate(list(piper.synthesize(text, voice="joe"))).astype(np.float32)
    audio = soxr.resample(audio / 32768.0, piper.sample_rate, SAMPLE_RATE)
    pad = np.zeros(int(pad_s * SAMPLE_RATE), dtype=np.float32)
    return (np.concatenate([pad, audio, pad]) * 32767).astype("<i2").tobytes()


def heard(engine: MicroWakeWordEngine, pcm: bytes, names: list[str], step: int = 2048) -> list:
    stream = engine.new_stream(names)
    try:
        return [d for i in range(0, len(pcm), step) for d in stream.process(pcm[i : i + step])]
    finally:
        stream.close()


def test_each_word_is_heard_by_its_model_as_the_package_hears_it(
    engine: MicroWakeWordEngine, piper: PiperTts
) -> None:
    from pymicro_wakeword import MicroWakeWord, MicroWakeWordFeatures, Model

    for text, name in [("Okay Nabu.", "okay_nabu"), ("Hey Jarvis.", "hey_jarvis")]:
        pcm = say(piper, text)
        # Odd chunk sizes: the frontend's 10 ms steps straddle chunk boundaries.
        assert [d.name for d in heard(engine, pcm, list(engine.names), step=777)] == [name]
        reference = MicroWakeWord.from_builtin(Model(name))
        features = MicroWakeWordFeatures()
        assert any(reference.process_streaming(f) for f in features.process_streaming(pcm))
    assert heard(engine, say(piper, "Turn on the lights."), list(engine.names)) == []


def test_refractory_period_and_stream_state(engine: MicroWakeWordEngine, piper: PiperTts) -> None:
    nabu = say(piper, "Okay Nabu.", pad_s=0.2)
    twice_fast = heard(engine, nabu + nabu, ["okay_nabu"])  # ~1.5 s apart: once
    assert len(twice_fast) == 1
    gap = bytes(int(2.5 * SAMPLE_RATE) * 2)
    twice_slow = heard(engine, nabu + gap + nabu, ["okay_nabu"])
    assert len(twice_slow) == 2 and twice_slow[1].timestamp_ms - twice_slow[0].timestamp_ms > 2000
    # Two streams fed alternately keep their own state: each hears only its own audio.
    silent, speaking = engine.new_stream(["okay_nabu"]), engine.new_stream(["okay_nabu"])
    quiet = bytes(len(nabu))
    found: dict[str, list[object]] = {"silent": [], "speaking": []}
    for i in range(0, len(nabu), 2048):
        found["silent"] += silent.process(quiet[i : i + 2048])
        found["speaking"] += speaking.process(nabu[i : i + 2048])
    assert found["silent"] == [] and len(found["speaking"]) == 1


def test_an_unknown_wake_model_stops_serve_with_one_line() -> None:
    env = clean_env(VOXSERVE_WAKE__MODELS='["okay_nabu", "hey_siri"]')
    proc = run_cli("serve", "--port", "0", "--grpc-port", "0", "--wyoming-port", "0", env=env)
    assert proc.returncode == 2
    assert_one_error_line(proc, "wake.models", "hey_siri", "okay_nabu, hey_jarvis")


@pytest.mark.parametrize(
    "setting",
    [
        {"probability_cutoff": {"okay_nabu": 0}},  # every window would fire
        {"probability_cutoff": {"okay_nabu": 1.5}},  # the word could never fire
        {"sliding_window_size": {"okay_nabu": 0}},  # never fires: no window fills
        {"sliding_window_size": {"okay_nabu": -1}},  # every stream would fail to open
    ],
)
def test_a_per_model_override_out_of_range_is_a_config_error(setting: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        WakeConfig(**setting)

"""SileroVad on real audio: one shared session, per-stream state, optional WebRTC pre-gate."""

from __future__ import annotations

import threading

import numpy as np

from tests.engines.conftest import load_fixture
from voxserve.engines.base import VadEngine
from voxserve.engines.silero_vad import SileroState, SileroVad
from voxserve.engines.webrtc_gate import WebrtcGate
from voxserve.types import SAMPLE_RATE

W = 512
LEAD_WINDOWS = int(0.25 * SAMPLE_RATE) // W  # fixtures start with 0.25 s of digital silence


def run_chunks(vad: SileroVad, state: SileroState, audio: np.ndarray, chunk: int) -> np.ndarray:
    parts = [vad.speech_probs(state, audio[i : i + chunk]) for i in range(0, audio.size, chunk)]
    return np.concatenate(parts)


def test_is_a_vad_engine(vad: SileroVad) -> None:
    assert isinstance(vad, VadEngine)
    assert vad.window_samples == 512
    assert vad.info.kind == "vad" and vad.info.name == "silero"


def test_speech_high_silence_low(vad: SileroVad) -> None:
    audio = load_fixture("lights.wav")
    probs = vad.speech_probs(vad.new_state(), audio)
    assert probs.shape == (audio.size // W,)
    assert probs.dtype == np.float32
    assert np.all((probs >= 0.0) & (probs <= 1.0))
    assert probs[:LEAD_WINDOWS].max() < 0.1  # leading digital silence
    speech = probs[LEAD_WINDOWS + 3 : -LEAD_WINDOWS - 3]
    assert np.mean(speech > 0.5) > 0.8
    assert probs.max() > 0.95


def test_two_turns_has_a_gap(vad: SileroVad) -> None:
    audio = load_fixture("two_turns.wav")
    probs = vad.speech_probs(vad.new_state(), audio)
    speech = np.flatnonzero(probs > 0.5)
    # the longest pause inside the speech is the 1.2 s gap between the two sentences
    pauses = np.diff(speech) - 1
    longest = int(pauses.max()) * W / SAMPLE_RATE
    assert 0.9 < longest < 1.5
    # ... and the comma in the first sentence is much shorter
    assert np.sort(pauses)[-2] * W / SAMPLE_RATE < 0.5


def test_digital_silence_low(vad: SileroVad) -> None:
    probs = vad.speech_probs(vad.new_state(), np.zeros(2 * SAMPLE_RATE, dtype=np.float32))
    assert probs.max() < 0.05


def test_low_level_noise_low(vad: SileroVad) -> None:
    rng = np.random.default_rng(7)
    for level in (0.003, 0.01):  # about -50 and -40 dBFS white noise
        noise = (rng.standard_normal(3 * SAMPLE_RATE) * level).astype(np.float32)
        probs = vad.speech_probs(vad.new_state(), noise)
        assert probs.max() < 0.3, level


def test_partial_window_is_ignored(vad: SileroVad) -> None:
    assert vad.speech_probs(vad.new_state(), np.zeros(W - 1, dtype=np.float32)).size == 0
    assert vad.speech_probs(vad.new_state(), np.zeros(3 * W + 7, dtype=np.float32)).size == 3


def test_interleaved_streams_do_not_mix(vad: SileroVad) -> None:
    a, b = load_fixture("lights.wav"), load_fixture("weather.wav")
    alone_a = run_chunks(vad, vad.new_state(), a, 3 * W)
    alone_b = run_chunks(vad, vad.new_state(), b, 3 * W)

    sa, sb = vad.new_state(), vad.new_state()
    got_a: list[np.ndarray] = []
    got_b: list[np.ndarray] = []
    for i in range(0, max(a.size, b.size), 3 * W):
        if i < a.size:
            got_a.append(vad.speech_probs(sa, a[i : i + 3 * W]))
        if i < b.size:
            got_b.append(vad.speech_probs(sb, b[i : i + 3 * W]))
    np.testing.assert_allclose(np.concatenate(got_a), alone_a, atol=1e-6)
    np.testing.assert_allclose(np.concatenate(got_b), alone_b, atol=1e-6)


def test_chunking_does_not_matter(vad: SileroVad) -> None:
    audio = load_fixture("weather.wav")
    whole = vad.speech_probs(vad.new_state(), audio)
    np.testing.assert_allclose(run_chunks(vad, vad.new_state(), audio, W), whole, atol=1e-6)


def test_reset_state_forgets(vad: SileroVad) -> None:
    audio = load_fixture("command.wav")
    state = vad.new_state()
    first = vad.speech_probs(state, audio)
    vad.reset_state(state)
    np.testing.assert_allclose(vad.speech_probs(state, audio), first, atol=1e-6)


def test_threads_share_one_engine(vad: SileroVad) -> None:
    audio = [load_fixture(n) for n in ("lights.wav", "weather.wav", "reminder.wav")]
    expected = [vad.speech_probs(vad.new_state(), x) for x in audio]
    results: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        results[i] = run_chunks(vad, vad.new_state(), audio[i], 2 * W)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(audio))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, want in enumerate(expected):
        np.testing.assert_allclose(results[i], want, atol=1e-6)


def test_pregate_skips_silero_on_silence(gated_vad: SileroVad) -> None:
    state = gated_vad.new_state()
    probs = gated_vad.speech_probs(state, np.zeros(SAMPLE_RATE, dtype=np.float32))
    assert probs.size == SAMPLE_RATE // W
    assert state.gated_windows == probs.size
    assert np.all(probs == 0.0)


def test_pregate_keeps_speech(gated_vad: SileroVad, vad: SileroVad) -> None:
    audio = load_fixture("lights.wav")
    state = gated_vad.new_state()
    gated = gated_vad.speech_probs(state, audio)
    plain = vad.speech_probs(vad.new_state(), audio)
    assert 0 < state.gated_windows < gated.size  # silence skipped, speech not
    # the windows silero calls speech are still speech with the gate on
    assert np.mean(gated[plain > 0.9] > 0.5) > 0.9


def test_webrtc_gate_carries_partial_frames() -> None:
    gate = WebrtcGate(aggressiveness=3)
    state = gate.new_state()
    assert not gate.may_be_speech(state, np.zeros(W, dtype=np.float32))
    assert state.carry.size == W % 160
    gate.reset_state(state)
    assert state.carry.size == 0


def test_batched_streams_match_one_at_a_time(vad: SileroVad) -> None:
    """Window k of every stream in one model call gives each stream its own probabilities."""
    names = ["command.wav", "lights.wav", "weather.wav", "long.wav"]
    clips = [load_fixture(n)[: 48_000 - 512 * i] for i, n in enumerate(names)]
    alone = [vad.speech_probs(vad.new_state(), clip) for clip in clips]
    states = [vad.new_state() for _ in clips]
    pieces: list[list[np.ndarray]] = [[] for _ in clips]
    for offset in range(0, 48_000, 1024):  # two windows per call, as the pipeline sends
        for i, probs in enumerate(
            vad.speech_probs_many(states, [c[offset : offset + 1024] for c in clips])
        ):
            pieces[i].append(probs)
    for i, clip in enumerate(clips):
        batched = np.concatenate(pieces[i])
        assert batched.size == alone[i].size == clip.size // 512
        np.testing.assert_allclose(batched, alone[i], atol=1e-5)

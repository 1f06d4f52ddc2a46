"""A cheap speech pre-gate built on the WebRTC VAD (webrtcvad-wheels, MIT).

The WebRTC VAD costs a few microseconds per 10 ms frame, far less than a silero window, so
it can decide that obvious non-speech (silence, steady low noise) needs no neural model at all.
Its detector is stateful (noise estimates, hangover), so each stream owns one `GateState`;
the `WebrtcGate` itself only holds settings and is shared read-only.
"""

from __future__ import annotations

import numpy as np
import webrtcvad

from voxserve.engines.base import Float32Array, Int16Array
from voxserve.types import SAMPLE_RATE

FRAME_10MS = SAMPLE_RATE // 100  # 160 samples: webrtcvad takes 10/20/30 ms frames


class GateState:
    """Per-stream WebRTC detector plus the samples left over from the last call (< 10 ms)."""

    __slots__ = ("carry", "vad")

    def __init__(self, aggressiveness: int) -> None:
        self.vad = webrtcvad.Vad(aggressiveness)
        self.carry: Int16Array = np.zeros(0, dtype=np.int16)


class WebrtcGate:
    """Says whether a block of 16 kHz audio may contain speech, using 10 ms WebRTC frames."""

    def __init__(self, *, aggressiveness: int = 2) -> None:
        if not 0 <= aggressiveness <= 3:
            raise ValueError(f"aggressiveness must be 0..3, got {aggressiveness}")
        self.aggressiveness = aggressiveness

    def new_state(self) -> GateState:
        return GateState(self.aggressiveness)

    def reset_state(self, state: GateState) -> None:
        # webrtcvad has no reset call; a fresh detector is cheap (a few hundred bytes).
        state.vad = webrtcvad.Vad(self.aggressiveness)
        state.carry = np.zeros(0, dtype=np.int16)

    def may_be_speech(self, state: GateState, audio: Float32Array) -> bool:
        """True if any complete 10 ms frame in carry + `audio` is speech to WebRTC.

        Samples that do not fill a frame are kept for the next call, so the detector sees a
        continuous signal although silero windows (512) are not a multiple of 160.
        """
        pcm = to_int16(audio)
        if state.carry.size:
            pcm = np.concatenate((state.carry, pcm))
        n_frames = pcm.size // FRAME_10MS
        used = n_frames * FRAME_10MS
        state.carry = pcm[used:].copy()
        raw = pcm[:used].tobytes()
        speech = False
        # Feed every frame (not stopping at the first hit) so the detector's own
        # noise tracking and hangover stay in step with the signal.
        for i in range(n_frames):
            frame = raw[i * 2 * FRAME_10MS : (i + 1) * 2 * FRAME_10MS]
            if state.vad.is_speech(frame, SAMPLE_RATE):
                speech = True
        return speech


def to_int16(audio: Float32Array) -> Int16Array:
    """Float samples in [-1, 1] to int16 PCM, clipping out-of-range values."""
    scaled: Float32Array = np.clip(np.asarray(audio, dtype=np.float32) * 32768.0, -32768.0, 32767.0)
    return scaled.astype(np.int16)

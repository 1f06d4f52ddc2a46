"""One stream's audio as the VAD engine takes it: whole windows (32 ms for silero), its state.

Apart from the listener because it is framing, not turn taking: the ring hands over any
number of samples, the engine judges whole windows only, so what is left of each batch waits
here for the next one; at the end of input it is padded with silence to a window; when turn
detection comes back on, the audio push-to-talk kept is judged from a fresh engine state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from voxserve.audio.pcm import Float32Array, Int16Array, to_float32
from voxserve.engines.base import VadEngine


class VadWindows:
    def __init__(self, vad: VadEngine) -> None:
        self.vad = vad
        self.window = vad.window_samples
        self.state: Any = vad.new_state()  # the engine's, for this stream
        self._leftover = np.zeros(0, dtype=np.float32)  # less than a window, waiting

    def take(self, samples: Int16Array) -> Float32Array | None:
        """The whole windows of what waited and `samples`; the rest waits (None: no whole
        window yet)."""
        audio = to_float32(samples)
        if self._leftover.size:
            audio = np.concatenate((self._leftover, audio))
        usable = audio.size - audio.size % self.window
        self._leftover = audio[usable:]
        return audio[:usable] if usable else None

    def last(self) -> Float32Array | None:
        """End of input: what waits, padded with silence to a whole window (None: nothing)."""
        if not self._leftover.size:
            return None
        padded = np.zeros(self.window, dtype=np.float32)
        padded[: self._leftover.size] = self._leftover
        self._leftover = np.zeros(0, dtype=np.float32)
        return padded

    def drop(self) -> None:
        """Forget what waits (its samples are in the stream's audio, or no longer wanted)."""
        self._leftover = np.zeros(0, dtype=np.float32)

    def restart(self, held: Int16Array) -> Float32Array:
        """Judge `held` from a fresh engine state: its whole windows (maybe none); the rest
        waits."""
        self.state = self.vad.new_state()
        audio = to_float32(held)
        usable = audio.size - audio.size % self.window
        self._leftover = audio[usable:]
        return audio[:usable]

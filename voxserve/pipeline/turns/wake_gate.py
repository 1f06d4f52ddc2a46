"""/v1/stream's `wake_word`: ASR waits for the word, takes one command, then waits again.

Every sample of the session goes through the wake stream (its own detection state), in the
listener's order, so a detection's sample is a position in the session's audio. VAD runs as
usual (its state stays warm), but while the gate is closed its probabilities are read as
silence, so no turn starts: nothing before the word is transcribed. A detection opens the
gate at the word's end: VAD windows from there count, the turn's audio starts there (not
before: the word itself is not transcribed), and `wake.detected` precedes its `vad.start`.
The gate closes again when that turn ends (its `vad.end`, however the turn ended: the VAD
round, or semantic_vad's decode at a pause in the listener's task: one command per wake
word, as a Home Assistant satellite goes back to listening for the word), or when no speech started
within `wake.command_window_s` of audio after the word.

The model runs in the VAD batcher's round, on the event loop (`Listener.vad_input`): one
word on a 64 ms batch is ~0.3 ms, under `pipeline.inline_below_us`, the bound under which a
thread hop costs more than the call (docs/benchmarks.md "Wake words").
"""

from __future__ import annotations

import numpy as np

from voxserve.audio.pcm import Float32Array, Int16Array
from voxserve.engines.micro_wakeword import Detection, WakeStream
from voxserve.types import SAMPLE_RATE


class WakeGate:
    """One session's gate: its wake stream, where the gate opened (None: closed), and the
    detections not yet told to the client."""

    def __init__(self, stream: WakeStream, command_window_s: float) -> None:
        self.stream = stream
        self.window = int(command_window_s * SAMPLE_RATE)
        self.open_from: int | None = None
        self._heard: list[Detection] = []

    def feed(self, samples: Int16Array) -> None:
        """The session's next audio (blocking: the model runs on it). A detection while
        closed opens the gate; one while open (the refractory period past) is ignored."""
        for detection in self.stream.process(samples.astype("<i2", copy=False).tobytes()):
            if self.open_from is None:
                self.open_from = detection.sample
                self._heard.append(detection)

    def take_heard(self) -> list[Detection]:
        heard, self._heard = self._heard, []
        return heard

    def mask(self, probs: Float32Array, position: int, window: int) -> Float32Array:
        """VAD probabilities of windows from sample `position` on, as the turn detector
        should see them: silence for every window that starts before the gate opened."""
        if self.open_from is None:
            return np.zeros_like(probs)
        shut = min(probs.size, max(0, -(-(self.open_from - position) // window)))
        if not shut:
            return probs
        probs = probs.copy()
        probs[:shut] = 0.0
        return probs

    def after_turns(self, position: int, speaking: bool, turn_ended: bool) -> None:
        """Close after the command's turn ended, or when none started in time."""
        opened = self.open_from
        if opened is None:
            return
        if turn_ended or (not speaking and position - opened > self.window):
            self.open_from = None

    def turn_ended(self, end: int) -> None:
        """A turn ended at sample `end` however it ended (the VAD round, semantic_vad's
        decode at a pause, a commit): the gate opened before it closes; one opened by a
        later word stays open."""
        if self.open_from is not None and self.open_from <= end:
            self.open_from = None

    def close(self) -> None:
        self.stream.close()

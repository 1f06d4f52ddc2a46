"""Fake engines that fail on cue, for the fault-injection suite: the fault is chosen by the
input, so a poisoned stream and healthy streams share one server and one set of engines.

ASR: the dominant tone of an utterance picks the fault (`RAISE_HZ`, `HANG_HZ`, `DIE_HZ`);
any other tone is recognised as FakeAsr does. TTS: a word in the text does (`explode`,
`stall`, `die`). "Die" raises `EngineDied`, a SystemExit: what a native library that calls
exit(), or a worker thread torn down under the engine, looks like from the executor's side.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from tests.fakes import SR, FakeAsr, FakeTts, word_for
from voxserve.types import AsrResult

RAISE_HZ = 1500
HANG_HZ = 2500
DIE_HZ = 3500
HANG_S = 1.5  # longer than the fault server's stage timeouts (FAULT_TIMEOUT_S)
FAULT_TIMEOUT_S = 0.6


class EngineDied(SystemExit):
    """A SystemExit: escapes `except Exception`, and asyncio re-raises it out of the event
    loop if it reaches a task (that stopped the whole server before stage.py caught it)."""


class FakeFaultyAsr(FakeAsr):
    def __init__(self) -> None:
        super().__init__(delay_s=0.02)
        self.faults = 0
        self.hanging = 0  # calls still sleeping past their timeout
        self._lock = threading.Lock()

    def heard(self, result: AsrResult) -> AsrResult:
        fault = {word_for(RAISE_HZ): "raise", word_for(HANG_HZ): "hang", word_for(DIE_HZ): "die"}
        kind = fault.get(result.text)
        if kind is None:
            return result
        with self._lock:
            self.faults += 1
        if kind == "raise":
            raise RuntimeError("fake ASR failure")
        if kind == "die":
            raise EngineDied("fake ASR worker died")
        with self._lock:
            self.hanging += 1
        try:
            time.sleep(HANG_S)
        finally:
            with self._lock:
                self.hanging -= 1
        return result


class FakeFaultyTts(FakeTts):
    def __init__(self) -> None:
        super().__init__(seconds_per_word=0.05)
        self.hanging = 0

    def synthesize(self, text: str, *, voice: str, speed: float = 1.0) -> Iterator[np.ndarray]:
        self.calls.append(text)
        return self._faulty(text, speed)

    def _faulty(self, text: str, speed: float) -> Iterator[np.ndarray]:
        for word in text.lower().split():
            word = word.strip(".,!?")
            if word == "explode":
                raise RuntimeError("fake TTS failure")
            if word == "die":
                raise EngineDied("fake TTS worker died")
            if word == "stall":
                self.hanging += 1
                try:
                    time.sleep(HANG_S)
                finally:
                    self.hanging -= 1
            self.chunks_made += 1
            yield np.full(int(SR * self.seconds_per_word / speed), 1000, dtype=np.int16)


def fault_engines() -> dict[str, Any]:
    return {"asr": FakeFaultyAsr(), "tts": FakeFaultyTts()}

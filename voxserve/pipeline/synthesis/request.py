"""What a synthesis is asked for, checked once for every transport: the text an engine
will be given (`check_text`), the speed, the output rate, the voice and its engine, the chunk
sizes (`plan` -> SpeechRequest), and the names a request is known by (its cache key, its
service-rate key)."""

from __future__ import annotations

from dataclasses import dataclass

from voxserve.audio.resample import check_rate
from voxserve.cache.fingerprints import EngineFingerprints
from voxserve.cache.key import SHARED_SCOPE, CacheKey, canonical_text, make_key, round_speed
from voxserve.engines.base import TtsEngine
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.context import SpeechContext
from voxserve.pipeline.synthesis.chunking import Chunker, chunk_sizes
from voxserve.speakable import clean_text, is_speakable
from voxserve.types import SUPPORTED_OUTPUT_RATES, Voice

MIN_SPEED = 0.25
MAX_SPEED = 4.0


def check_text(text: str, max_chars: int) -> str:
    """The text an engine will be given: stripped and cleaned (voxserve/speakable.py).
    Over `max_chars` is `text_too_long`; nothing to say is `empty_text`."""
    text = text.strip()
    if not text:
        raise VoxError(ErrorCode.EMPTY_TEXT, "text to synthesise is empty")
    if len(text) > max_chars:
        raise VoxError(
            ErrorCode.TEXT_TOO_LONG, f"text has {len(text)} characters; the limit is {max_chars}"
        )
    text = clean_text(text).strip()
    if not is_speakable(text):
        raise VoxError(
            ErrorCode.EMPTY_TEXT,
            "text has nothing to speak: only punctuation, white space or invisible characters",
        )
    return text


def check_speed(speed: float) -> float:
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            f"speed {speed:g} is out of range; use {MIN_SPEED:g} to {MAX_SPEED:g}",
        )
    return speed


@dataclass(frozen=True, slots=True)
class SpeechRequest:
    """A validated synthesis: what to say, with which engine, in what chunks."""

    text: str
    voice: Voice
    engine: TtsEngine
    speed: float  # rounded to 0.01, as in the cache key
    sample_rate: int
    max_samples: int  # per chunk: tts.max_chunk_ms at sample_rate
    first_samples: int  # the first chunk: tts.first_chunk_ms at sample_rate

    def chunker(self) -> Chunker:
        return Chunker(self.first_samples, self.max_samples)


def plan(
    ctx: SpeechContext, text: str, voice: str | None, speed: float, sample_rate: int | None
) -> SpeechRequest:
    settings = ctx.settings
    out_rate = check_rate(sample_rate or settings.tts.output_sample_rate, SUPPORTED_OUTPUT_RATES)
    # The engine is given the text's canonical (NFC) form, the one its cache key names.
    text = canonical_text(check_text(text, settings.limits.max_text_chars))
    check_speed(speed)
    voice_info, engine = ctx.engines.voice(voice)
    first_samples, max_samples = chunk_sizes(settings.tts, out_rate)
    return SpeechRequest(
        text, voice_info, engine, round_speed(speed), out_rate, max_samples, first_samples
    )


def cache_key(
    fingerprints: EngineFingerprints, request: SpeechRequest, scope: str = SHARED_SCOPE
) -> CacheKey:
    return make_key(
        request.text,
        voice=request.voice.id,
        speed=request.speed,
        sample_rate=request.sample_rate,
        engine=fingerprints.of(request.engine),
        scope=scope,
    )


def rate_key(request: SpeechRequest) -> str:
    """Whose service rate a synthesis measures and is predicted by: engine/voice."""
    return f"{request.engine.info.name}/{request.voice.id}"

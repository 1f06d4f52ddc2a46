"""Whole-buffer recognition (uploads, `voxserve transcribe`) through the shared ASR stage."""

from __future__ import annotations

from functools import partial

from voxserve.audio.pcm import Int16Array, to_float32
from voxserve.audio.resample import resample
from voxserve.errors import ErrorCode, VoxError
from voxserve.runtime import Runtime
from voxserve.types import SAMPLE_RATE, AsrResult

MIN_FILE_RATE = 4_000
MAX_FILE_RATE = 192_000


async def transcribe(
    runtime: Runtime, samples: Int16Array, sample_rate: int, *, language: str | None = None
) -> AsrResult:
    """Recognise a whole recording. The stage deadline grows with the audio's length."""
    if not MIN_FILE_RATE <= sample_rate <= MAX_FILE_RATE:
        raise VoxError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"sample rate {sample_rate} is outside {MIN_FILE_RATE}-{MAX_FILE_RATE} Hz",
        )
    engines = runtime.engines
    language = engines.check_language(language)
    if samples.size == 0:
        raise VoxError(ErrorCode.EMPTY_AUDIO, "no audio to transcribe")
    audio = to_float32(resample(samples, sample_rate, SAMPLE_RATE))
    stage = runtime.stage("asr")
    seconds = audio.size / SAMPLE_RATE
    result: AsrResult = await stage.run(
        partial(engines.asr.transcribe, audio, language=language),
        timeout_s=stage.timeout_s + seconds,
    )
    return result

"""Text to audio chunks through the shared TTS stage; used by every transport.

The engine's blocking generator is pulled one chunk per executor call, so other sessions'
first chunks interleave with a long reply, and a cancelled request stops between chunks.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator

import numpy as np

from voxserve.audio.pcm import Int16Array
from voxserve.audio.resample import StreamResampler, check_rate
from voxserve.errors import ErrorCode, VoxError
from voxserve.runtime import Runtime
from voxserve.types import SUPPORTED_OUTPUT_RATES

MIN_SPEED = 0.25
MAX_SPEED = 4.0


class _LockedGenerator:
    """Lets `close()` wait for a `next()` still running on another thread."""

    def __init__(self, gen: Iterator[Int16Array]) -> None:
        self._gen = gen
        self._lock = threading.Lock()

    def next_chunk(self) -> Int16Array | None:
        with self._lock:
            return next(self._gen, None)

    def close(self) -> None:
        with self._lock:
            close = getattr(self._gen, "close", None)
            if callable(close):
                close()


def check_text(text: str, max_chars: int) -> str:
    text = text.strip()
    if not text:
        raise VoxError(ErrorCode.EMPTY_TEXT, "text to synthesise is empty")
    if len(text) > max_chars:
        raise VoxError(
            ErrorCode.TEXT_TOO_LONG, f"text has {len(text)} characters; the limit is {max_chars}"
        )
    return text


def check_speed(speed: float) -> float:
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise VoxError(
            ErrorCode.INVALID_PARAMETER,
            f"speed {speed:g} is out of range; use {MIN_SPEED:g} to {MAX_SPEED:g}",
        )
    return speed


def split_chunk(samples: Int16Array, max_samples: int) -> Iterator[Int16Array]:
    for start in range(0, samples.size, max_samples):
        yield samples[start : start + max_samples]


async def synthesize(
    runtime: Runtime,
    text: str,
    *,
    voice: str | None = None,
    speed: float = 1.0,
    sample_rate: int | None = None,
) -> AsyncIterator[Int16Array]:
    """Yield int16 chunks (at most `tts.max_chunk_ms` each) at `sample_rate` as they are made."""
    settings = runtime.settings
    out_rate = check_rate(sample_rate or settings.tts.output_sample_rate, SUPPORTED_OUTPUT_RATES)
    text = check_text(text, settings.limits.max_text_chars)
    check_speed(speed)
    voice_info, engine = runtime.engines.voice(voice)
    stage = runtime.stage("tts")
    max_samples = max(1, out_rate * settings.tts.max_chunk_ms // 1000)
    resampler = StreamResampler(engine.sample_rate, out_rate)
    source = _LockedGenerator(engine.synthesize(text, voice=voice_info.id, speed=speed))
    try:
        while True:
            chunk = await stage.run(source.next_chunk)
            if chunk is None:
                break
            out = resampler.process(np.asarray(chunk, dtype=np.int16))
            for piece in split_chunk(out, max_samples):
                yield piece
        for piece in split_chunk(resampler.flush(), max_samples):
            yield piece
    finally:
        # Closing waits for a chunk still being made, so do it on the executor.
        runtime.executor.submit(source.close)


async def synthesize_all(
    runtime: Runtime,
    text: str,
    *,
    voice: str | None = None,
    speed: float = 1.0,
    sample_rate: int | None = None,
) -> Int16Array:
    chunks = [
        chunk
        async for chunk in synthesize(
            runtime, text, voice=voice, speed=speed, sample_rate=sample_rate
        )
    ]
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)

"""Speech made beside live traffic: the fallback phrase in every voice before the server is
ready, and the sentences of a prewarm file into the cache once it is.

Both go through `cache_speech` (pipeline/synthesis/synthesize.py), so a restart finds them cached.
"""

from __future__ import annotations

import logging
from pathlib import Path

from voxserve.cache.prewarm import Prewarmer, PrewarmItem, read_sentences
from voxserve.errors import VoxError
from voxserve.pipeline.context import SpeechContext
from voxserve.pipeline.synthesis.synthesize import cache_speech

log = logging.getLogger(__name__)


async def make_fallback(ctx: SpeechContext) -> None:
    """The fallback phrase in every voice, from the cache or made now (before ready: a
    degraded server must always have it)."""
    fallback = ctx.speech.fallback
    text = fallback.text
    if text is None:
        return
    rate = ctx.settings.tts.output_sample_rate
    for voice in ctx.engines.voices():
        try:
            samples, _ = await cache_speech(ctx, text, voice=voice.id, sample_rate=rate)
        except VoxError as exc:
            log.warning(
                "fallback phrase failed", extra={"voice": voice.id, "error": exc.code.value}
            )
            continue
        if samples.size:
            fallback.add(voice.id, rate, samples)


async def prewarm_one(ctx: SpeechContext, item: PrewarmItem) -> bool:
    """Cache one prewarm item, taking a TTS slot only when live traffic leaves one spare;
    True if it had to be synthesised."""
    _, made = await cache_speech(
        ctx,
        item.text,
        voice=item.voice,
        speed=item.speed,
        sample_rate=item.sample_rate,
        polite=True,
    )
    return made


def log_prewarm(done: int, total: int) -> None:
    """Prewarm progress in the log: every 100 sentences and at the end."""
    if done == total or done % 100 == 0:
        log.info("tts cache prewarm", extra={"done": done, "total": total})


def start_prewarm_file(prewarmer: Prewarmer, path: Path) -> None:
    """Queue the sentences of a prewarm file (a bad file is logged, never fatal)."""
    try:
        texts = read_sentences(path)
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("prewarm file unreadable", extra={"path": str(path), "error": str(exc)})
        return
    log.info("prewarming the tts cache", extra={"sentences": len(texts)})
    try:
        prewarmer.submit([PrewarmItem(text) for text in texts])
    except ValueError as exc:
        log.warning("prewarm file too long", extra={"error": str(exc)})

"""An upload decoded as bounded work: refused on its header when it declares too much,
admitted by the bytes its decode will hold, then decoded a window at a time in the decode
pool, each window's bytes reserved before it is made (audio/decode.py, audio_budget.py,
work_pools.py).

Between windows other uploads take their turn (least decoded first), and a caller that is
cancelled (its client gone) stops the decode within the window running: the decoder's stop
flag is read at every frame. Nothing here runs on the event loop but the bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass

from voxserve.audio.decode import WINDOW_S, UploadDecoder
from voxserve.audio.pcm import Int16Array
from voxserve.config import LimitsConfig
from voxserve.pipeline.recognition.audio_budget import DecodedAudioBudget, Reservation
from voxserve.pipeline.scheduling.work_pools import WorkPool
from voxserve.types import SAMPLE_RATE

UPLOAD_BYTES_PER_SECOND = 4_000
"""An upload may decode to at most max_upload_bytes / this many seconds (32 kbit/s: 25 MB
holds ~1.8 h): a small file that decodes to hours is refused, not held in memory."""
SAMPLE_BYTES = 2  # uploads are held as int16 (half of float32: 1.8 h is 207 MB); each
# window becomes float32 only where an engine reads it, in the engine's thread


def max_upload_seconds(limits: LimitsConfig) -> float:
    """The most audio one upload may hold: by its size, and by the decoded-audio budget
    (less one window, the join's room)."""
    by_budget = limits.max_decoded_audio_bytes / (SAMPLE_BYTES * SAMPLE_RATE) - 2 * WINDOW_S
    return max(WINDOW_S, min(limits.max_upload_bytes / UPLOAD_BYTES_PER_SECOND, by_budget))


@dataclass(frozen=True, slots=True)
class DecodedUpload:
    """The samples (int16, 16 kHz mono) and the budget they hold until `held` is released."""

    samples: Int16Array
    held: Reservation


async def decode_upload(
    data: bytes, *, max_seconds: float, pool: WorkPool, budget: DecodedAudioBudget
) -> DecodedUpload:
    """Decode `data` (module docstring); raises 413 `message_too_large` past `max_seconds`
    (on the header when it says so), 503 `overloaded` when the budget has no room."""
    rate = SAMPLE_RATE
    decoder = await pool.run(UploadDecoder, data, max_seconds=max_seconds, rate=rate, dtype="s16")
    window = int(WINDOW_S * rate)
    per_sample = decoder.itemsize
    declared = int((decoder.declared_s or 0.0) * rate)
    held: Reservation | None = None
    try:
        held = await budget.reserve((declared + window) * per_sample)  # admitted by its header
        while not decoder.done:
            ask = max(window, decoder.next_window)
            await held.grow_to((decoder.samples + ask + window) * per_sample)
            await pool.run_ranked(decoder.samples / rate, decoder.decode_window, ask)
        samples: Int16Array = await pool.run_ranked(decoder.samples / rate, decoder.finish)
    except BaseException:  # a refusal, a damaged file, or the client gone (cancelled)
        decoder.stop()  # a window running in its thread ends at its next frame
        if held is not None:
            held.release()
        raise
    decoder.close()
    held.shrink_to(samples.nbytes)
    return DecodedUpload(samples, held)

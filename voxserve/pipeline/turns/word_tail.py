"""The sound after the VAD's end of speech that still belongs to the last word.

A word that ends in a stop ("joke", "book", "that") closes the mouth for 50-120 ms before
the release: the VAD hears the closure as silence and its end of speech falls there. Whether
it then hears the release as speech again is a coin toss at its threshold, and Opus over a
WebRTC call tips it (the release's burst coded as noise: silero gave it 0.26 and 0.36 where
the same recording over the WebSocket gave 0.53 and 0.58). The decode at a pause gets the
audio up to the VAD's end only (vad.pause_tail_ms: Whisper writes a word into trailing
silence), so a turn confirmed there was heard as "Please tell me a Joe". This finds that
release by its energy: a final decoded again up to where it ends hears the whole word, and
a pause followed by silence (no sound after the VAD's end) keeps its decode.

Pure: samples in, a sample index out.
"""

from __future__ import annotations

import numpy as np

from voxserve.audio.pcm import Int16Array

FRAME_S = 0.01  # energy measured over 10 ms frames: a release burst lasts 10-40 ms
OVER_FLOOR_DB = 12.0  # sound: this far over the recording's quietest tenth (its noise) ...
UNDER_PEAK_DB = 50.0  # ... and no further than this under its loudest frame (digital silence)
MARGIN_S = 0.03  # kept after the last sound frame: the burst's own decay


def tail_sound_end(audio: Int16Array, speech_end: int, sample_rate: int) -> int | None:
    """The end (a sample index in `audio`, MARGIN_S past the last frame of sound) of the
    sound in `audio[speech_end:]`; None when that part is silence. `audio` holds the whole
    utterance (with the audio kept before its start): its quietest tenth is the noise floor
    and its loudest frame the speech level, so a level, noise or gain sets no threshold."""
    step = max(1, round(sample_rate * FRAME_S))
    usable = audio.size - audio.size % step
    first = -(-max(speech_end, 0) // step)  # the first whole frame after the VAD's end
    if usable <= 0 or first >= usable // step:
        return None
    frames = audio[:usable].reshape(-1, step).astype(np.float32)
    rms = np.sqrt(np.einsum("ij,ij->i", frames, frames) / step)
    floor = _tenth(rms)
    level = max(floor * 10 ** (OVER_FLOOR_DB / 20), float(rms.max()) * 10 ** (-UNDER_PEAK_DB / 20))
    loud = np.flatnonzero(rms[first:] > max(level, 1.0))
    if loud.size == 0:
        return None
    last = first + int(loud[-1]) + 1
    return min(audio.size, last * step + round(sample_rate * MARGIN_S))


def _tenth(values: np.ndarray) -> float:
    """np.percentile(values, 10) (its linear interpolation) by partial sorting: called at
    every turn's end, where percentile's own overhead was most of this module's cost."""
    at = 0.1 * (values.size - 1)
    low = int(at)
    high = min(low + 1, values.size - 1)
    part = np.partition(values, (low, high))
    return float(part[low] + (part[high] - part[low]) * (at - low))

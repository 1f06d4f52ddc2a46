"""Encode cost of /v1/audio/speech's formats against piper's synthesis cost (docs/benchmarks.md,
"Speech encoding"): CPU seconds per second of audio, one thread, real piper speech.

    .venv/bin/python scripts/bench_speech_encode.py [--seconds 30] [--repeat 5]

Piper synthesises the text once (timed: its cost per second of audio); the speech is resampled
to each format's rate (24 kHz; 48 kHz for opus) and encoded in 200 ms chunks, as the server
streams it, through voxserve/audio/encode.py, and through FFmpeg's native `opus` encoder
(experimental) for the opus choice. Best of --repeat runs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import av
import numpy as np

from voxserve.audio.encode import CODECS, AvEncoder, Codec, Encoder, open_encoder
from voxserve.audio.pcm import Int16Array
from voxserve.audio.resample import StreamResampler
from voxserve.engines.piper_tts import PiperTts

TEXT = (
    "The train to the city leaves from platform four at nine in the morning. "
    "Please remember to bring your ticket and a warm coat, because it is cold outside. "
    "We will meet again at the station cafe right after lunch on Friday. "
)


def speech(seconds: float) -> tuple[Int16Array, int, float]:
    """Piper speech of at least `seconds`, its rate and piper's CPU s per audio s."""
    engine = PiperTts(threads=1)
    list(engine.synthesize("Warm up.", voice="joe"))
    parts: list[Int16Array] = []
    started = time.process_time()
    while sum(p.size for p in parts) < seconds * engine.sample_rate:
        parts.extend(engine.synthesize(TEXT, voice="joe"))
    cost = time.process_time() - started
    samples = np.concatenate(parts)
    return samples, engine.sample_rate, cost / (samples.size / engine.sample_rate)


def resample(samples: Int16Array, src: int, dst: int) -> Int16Array:
    resampler = StreamResampler(src, dst)
    return np.concatenate([resampler.process(samples), resampler.flush()]).astype(np.int16)


def encode_cost(
    make: Callable[[], Encoder], samples: Int16Array, rate: int, repeat: int
) -> tuple[float, int]:
    step = rate // 5
    best, size = float("inf"), 0
    for _ in range(repeat):
        encoder = make()
        started = time.process_time()
        out = 0
        for i in range(0, samples.size, step):
            out += len(encoder.encode(samples[i : i + step]))
        out += len(encoder.finish())
        best = min(best, time.process_time() - started)
        size = out
    return best / (samples.size / rate), size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    samples, rate, piper_cost = speech(args.seconds)
    audio_s = samples.size / rate
    print(f"av {av.__version__}, FFmpeg libavcodec {av.library_versions['libavcodec']}")
    print(f"piper (joe, 1 thread): {piper_cost * 1000:.1f} ms CPU per s of audio ({audio_s:.1f} s)")
    by_rate = {r: resample(samples, rate, r) for r in (24_000, 48_000)}
    rows: list[tuple[str, Callable[[], Encoder], int]] = []
    for fmt, codec in CODECS.items():
        r = 48_000 if fmt == "opus" else 24_000
        rows.append((f"{fmt} ({codec.encoder or 'none'})", partial(open_encoder, fmt, r), r))
    # FFmpeg's own opus encoder is experimental: it opens only with strict -2.
    native = Codec("ogg", "opus", 32_000, options=(("strict", "-2"),))
    rows.append(("opus (FFmpeg native)", partial(AvEncoder, native, 48_000), 48_000))
    for name, make, r in rows:
        try:
            cost, size = encode_cost(make, by_rate[r], r, args.repeat)
        except Exception as exc:
            print(f"{name}: not available ({type(exc).__name__}: {exc})")
            continue
        kbps = size * 8 / audio_s / 1000
        share = cost / piper_cost * 100
        figures = f"{cost * 1000:.2f} ms CPU per s of audio, {kbps:.0f} kbit/s"
        print(f"{name}: {figures}, {share:.1f}% of piper")


if __name__ == "__main__":
    main()

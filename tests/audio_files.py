"""Audio files in the containers clients upload (MP3, M4A/AAC, Ogg/Opus, WebM/Opus, FLAC,
WAV), made with PyAV from 16 kHz mono int16 samples (a fixture WAV), for upload tests."""

from __future__ import annotations

import io

import av
import numpy as np

# name -> (FFmpeg muxer, encoder, encoder sample rate, MIME type)
CONTAINERS: dict[str, tuple[str, str, int, str]] = {
    "mp3": ("mp3", "libmp3lame", 16_000, "audio/mpeg"),
    "m4a": ("ipod", "aac", 16_000, "audio/mp4"),
    "ogg": ("ogg", "libopus", 48_000, "audio/ogg"),
    "webm": ("webm", "libopus", 48_000, "audio/webm"),
    "flac": ("flac", "flac", 16_000, "audio/flac"),
    "wav": ("wav", "pcm_s16le", 16_000, "audio/wav"),
}


def encode(samples: np.ndarray, container: str, rate: int = 16_000, repeat: int = 1) -> bytes:
    """`samples` (mono int16 at `rate`), `repeat` times over, as a complete file of
    `container` (repeating keeps a long file's memory small)."""
    muxer, codec, codec_rate, _ = CONTAINERS[container]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=muxer) as out:
        stream = out.add_stream(codec, rate=codec_rate, layout="mono")
        ctx = stream.codec_context
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(samples, dtype=np.int16).reshape(1, -1),
            format="s16",
            layout="mono",
        )
        frame.sample_rate = rate
        resampler = av.AudioResampler(
            format=ctx.format.name,
            layout="mono",
            rate=codec_rate,
            frame_size=ctx.frame_size or None,
        )
        pieces = resampler.resample(frame)
        for _ in range(repeat):
            for piece in pieces:
                piece.pts = None  # the encoder numbers them
                for packet in stream.encode(piece):
                    out.mux(packet)
        for piece in resampler.resample(None):
            for packet in stream.encode(piece):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()

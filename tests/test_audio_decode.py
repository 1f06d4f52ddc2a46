"""audio/decode.py on its own (real PyAV): the length bound that stops a decompression bomb."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import av
import numpy as np
import pytest

from tests.audio_files import encode
from tests.rss import MB, RssPeak
from voxserve.audio.decode import decode_audio
from voxserve.audio.encode import open_encoder
from voxserve.errors import ErrorCode, VoxError


def test_a_small_file_that_decodes_to_hours_is_refused_as_it_decodes() -> None:
    """FLAC of silence: 5 minutes in ~60 KB. Over the bound it is refused (413
    message_too_large), and under it the same file decodes whole."""
    bomb = encode(np.zeros(60 * 16_000, dtype=np.int16), "flac", repeat=5)
    assert len(bomb) < 100_000
    with pytest.raises(VoxError) as caught:
        decode_audio(bomb, max_seconds=60)
    assert caught.value.code is ErrorCode.MESSAGE_TOO_LARGE and "60 s" in caught.value.message
    assert decode_audio(bomb, max_seconds=400).size == 300 * 16_000


def test_a_playlist_naming_a_local_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ffconcat list names a file beside the server's working directory: FFmpeg would
    open and decode it (the upload would transcribe a server file). Refused, nothing read."""
    monkeypatch.chdir(tmp_path)
    speechlike = (np.sin(np.arange(16_000) / 5) * 10_000).astype(np.int16)
    with open("secret.wav", "wb") as out:
        out.write(encode(speechlike, "wav"))
    with pytest.raises(VoxError) as caught:
        decode_audio(b"ffconcat version 1.0\nfile secret.wav\n", max_seconds=60)
    assert caught.value.code is ErrorCode.INVALID_AUDIO


class _Unseekable:
    """A write-only sink: FFmpeg streams into it, as a live encoder does (no Xing header)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, chunk: bytes) -> int:
        self.data += bytes(chunk)
        return len(chunk)


def _quiet_then_loud(rate: int) -> np.ndarray:
    noise = np.random.default_rng(0).normal(0, 8_000, rate * 3).clip(-32_000, 32_000)
    return np.concatenate([np.zeros(rate * 2), noise]).astype(np.int16)


def test_files_that_declare_no_length_are_decoded_whole() -> None:
    """ADTS AAC (what /v1/audio/speech sends for aac) and a variable-rate MP3 written as a
    stream declare no length; FFmpeg guesses one from the quiet start's low bit rate,
    several times the real length. Not a truncated file: both decode in full."""
    aac = open_encoder("aac", 24_000)
    adts = aac.encode(_quiet_then_loud(24_000)) + aac.finish()
    assert decode_audio(adts, max_seconds=60).size / 16_000 == pytest.approx(5.0, abs=0.1)

    sink = _Unseekable()
    with av.open(sink, "w", format="mp3") as out:
        stream = out.add_stream("libmp3lame", rate=16_000, layout="mono")
        stream.codec_context.qscale = 2  # variable bit rate
        stream.codec_context.flags |= av.codec.context.Flags.qscale
        frame = av.AudioFrame.from_ndarray(
            _quiet_then_loud(16_000).reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = 16_000
        resampler = av.AudioResampler(
            format=stream.codec_context.format.name, layout="mono", rate=16_000, frame_size=1152
        )
        for piece in [*resampler.resample(frame), *resampler.resample(None)]:
            piece.pts = None
            out.mux(stream.encode(piece))
        out.mux(stream.encode(None))
    vbr = bytes(sink.data)
    assert b"Xing" not in vbr[:2000] and b"Info" not in vbr[:2000]
    assert decode_audio(vbr, max_seconds=60).size / 16_000 == pytest.approx(5.0, abs=0.1)


def _adts(rate: int, layout: str) -> bytes:
    """Two seconds of a tone as ADTS AAC at `rate` in `layout` (mono or stereo)."""
    tone = (np.sin(np.arange(rate * 2) / 5) * 8_000).astype(np.int16)
    channels = 2 if layout == "stereo" else 1
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="adts") as out:
        stream = out.add_stream("aac", rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(
            np.repeat(tone, channels).reshape(1, -1), format="s16", layout=layout
        )
        frame.sample_rate = rate
        resampler = av.AudioResampler(
            format=stream.codec_context.format.name, layout=layout, rate=rate, frame_size=1024
        )
        for piece in [*resampler.resample(frame), *resampler.resample(None)]:
            piece.pts = None
            out.mux(stream.encode(piece))
        out.mux(stream.encode(None))
    return buffer.getvalue()


def test_a_stream_whose_rate_and_channels_change_midway_decodes_whole() -> None:
    """Joined ADTS files (24 kHz mono, then 16 kHz stereo): FFmpeg decodes both parts; the
    resampler follows the change instead of refusing the file as damaged."""
    joined = _adts(24_000, "mono") + _adts(16_000, "stereo")
    assert decode_audio(joined, max_seconds=60).size / 16_000 == pytest.approx(
        4.0, abs=0.25
    )  # + AAC priming


def test_a_huge_picture_beside_the_audio_is_not_decoded() -> None:
    """An upload with a video stream whose one frame is a 10000x10000 PNG (~150 KB in the
    file, 100 MB decoded): FFmpeg would decode it while probing. Only the audio is."""
    side = 10_000
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mov") as out:
        audio = out.add_stream("pcm_s16le", rate=16_000, layout="mono")
        video = out.add_stream("png", rate=1)
        video.width = video.height = side
        video.pix_fmt = "gray"
        picture = av.VideoFrame.from_ndarray(np.zeros((side, side), np.uint8), format="gray")
        picture.pts = 0
        out.mux(video.encode(picture))
        out.mux(video.encode(None))
        tone = (np.sin(np.arange(16_000) / 5) * 8_000).astype(np.int16).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(tone, format="s16", layout="mono")
        frame.sample_rate, frame.pts = 16_000, 0
        out.mux(audio.encode(frame))
        out.mux(audio.encode(None))
    upload = buffer.getvalue()
    del picture, buffer
    assert len(upload) < 500_000
    with RssPeak() as peak:
        samples = decode_audio(upload, max_seconds=60)
    assert samples.size == 16_000
    assert peak.growth < 40 * MB, peak.growth


def test_channels_without_positions_are_mixed_down() -> None:
    """A WAV of 9 channels without a channel mask (a microphone array): FFmpeg reads it but
    its resampler has no mix for unnamed channels; the channels are averaged instead of the
    file being refused as damaged."""
    channels, rate = 9, 16_000
    tone = (np.sin(np.arange(rate) / 5) * 8_000).astype("<i2")
    data = np.repeat(tone, channels).tobytes()
    block = 2 * channels
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * block, block, 16)
    wav = (
        b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack("<I", 16) + fmt
    ) + (b"data" + struct.pack("<I", len(data)) + data)
    samples = decode_audio(wav, max_seconds=60)
    assert samples.size == rate and int(np.abs(samples.astype(np.int32) - tone).max()) <= 1

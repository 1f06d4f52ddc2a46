"""PCM16 chunks in, container bytes out as they are made: the one streaming encoder of
`/v1/audio/speech` (mp3, opus in Ogg, aac in ADTS, flac, wav, pcm).

The compressed formats go through PyAV (FFmpeg in its wheel: libmp3lame, libopus, FFmpeg's
own aac and flac encoders) into an in-memory sink that is emptied after every chunk, so
memory stays bounded by one chunk's output and nothing touches the disk. The sink has no
`seek`, so FFmpeg writes every container as a stream: no header rewritten at the end (a
FLAC STREAMINFO without the total length, an mp3 without a Xing frame), which is what any
streaming player reads. WAV (a header of unknown length, as before) and raw PCM need no
codec and are written directly.

Encoders are blocking C calls; callers with an event loop run `encode`/`finish` on a worker
thread when a chunk is large (server/http/speech_output.py), and `close` never blocks on one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

import av
import numpy as np

from voxserve.audio.pcm import Int16Array
from voxserve.audio.wav import wav_header


@dataclass(frozen=True, slots=True)
class Codec:
    """How one response format is made: FFmpeg's container and encoder (None: no codec)."""

    container: str | None
    encoder: str | None
    bit_rate: int | None = None
    rates: tuple[int, ...] | None = None  # rates the encoder takes; None: any
    options: tuple[tuple[str, str], ...] = ()  # FFmpeg encoder options


# Opus: libopus, not FFmpeg's native `opus` encoder (experimental, and slower and larger
# in docs/benchmarks.md "Speech encoding"). Ogg pages every 100 ms rather than FFmpeg's 1 s
# default, so the first bytes leave with the first chunk.
CODECS: dict[str, Codec] = {
    "mp3": Codec("mp3", "libmp3lame", 64_000, (8_000, 16_000, 22_050, 24_000, 48_000)),
    "opus": Codec("ogg", "libopus", 32_000, (8_000, 12_000, 16_000, 24_000, 48_000)),
    "aac": Codec("adts", "aac", 64_000),
    "flac": Codec("flac", "flac"),
    "wav": Codec(None, None),
    "pcm": Codec(None, None),
}
FORMATS = tuple(CODECS)
_CONTAINER_OPTIONS = {"ogg": {"page_duration": "100000"}}
_IO_BUFFER = 4096  # FFmpeg's write buffer; flushed after every packet in any case


class Encoder(Protocol):
    raw: bool  # no codec: cheap enough to run anywhere

    def encode(self, samples: Int16Array) -> bytes:
        """The container bytes made from these samples (may be empty: encoder delay)."""
        ...

    def finish(self) -> bytes:
        """Flush the encoder and close the container: the last bytes."""
        ...

    def close(self) -> None:
        """Release the codec without flushing (a stream abandoned mid-way); idempotent."""
        ...


def variant_name(response_format: str, sample_rate: int) -> str | None:
    """The TTS cache's name for this encoding of a reply (cache/entry.py variants): all
    that changes its bytes but the PCM itself (format, container, encoder, bit rate,
    options, rate). None for wav and pcm: framing the cached PCM is as cheap as a copy."""
    codec = CODECS[response_format]
    if codec.encoder is None:
        return None
    container = _CONTAINER_OPTIONS.get(codec.container or "", {})
    options = ",".join(f"{k}={v}" for k, v in (*codec.options, *sorted(container.items())))
    bit_rate = codec.bit_rate or "default"
    return f"{response_format}/{codec.container}/{codec.encoder}/{bit_rate}/{options}/{sample_rate}"


def open_encoder(response_format: str, sample_rate: int) -> Encoder:
    """An encoder for one response. `response_format` is a key of CODECS; `sample_rate`
    must be one the format takes (`CODECS[...].rates`)."""
    codec = CODECS[response_format]
    if codec.encoder is None or codec.container is None:
        return _RawEncoder(wav_header(sample_rate) if response_format == "wav" else b"")
    return AvEncoder(codec, sample_rate)


class _RawEncoder:
    """Little-endian PCM16, behind an optional header written with the first bytes."""

    raw = True

    def __init__(self, header: bytes) -> None:
        self._header = header

    def encode(self, samples: Int16Array) -> bytes:
        data = self._header + samples.astype("<i2", copy=False).tobytes()
        self._header = b""
        return data

    def finish(self) -> bytes:
        data, self._header = self._header, b""
        return data

    def close(self) -> None:
        pass


class _Sink:
    """A write-only file for FFmpeg: what was written since the last `take`. No `seek`, so
    FFmpeg streams (pyio treats an object without seek as unseekable)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._parts.append(chunk)
        return len(chunk)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


class AvEncoder:
    """A PyAV (FFmpeg) encoder and muxer writing into a `_Sink`."""

    raw = False

    def __init__(self, codec: Codec, sample_rate: int) -> None:
        assert codec.container is not None and codec.encoder is not None
        self._rate = sample_rate
        self._sink = _Sink()
        options = {"flush_packets": "1", **_CONTAINER_OPTIONS.get(codec.container, {})}
        self._container = av.open(
            self._sink,
            mode="w",
            format=codec.container,
            container_options=options,
            buffer_size=_IO_BUFFER,
        )
        stream: Any = self._container.add_stream(
            codec.encoder, rate=sample_rate, options=dict(codec.options)
        )
        stream.layout = "mono"
        if codec.bit_rate is not None:
            stream.bit_rate = codec.bit_rate
        self._stream = stream
        self._pts = 0
        self._closed = False
        # close() may come from the event loop (a client gone) while a worker thread is in
        # encode(). The codec must not be freed under that call, and the loop must not wait
        # for it: close() then only asks, and the worker closes when its call is done.
        self._lock = threading.Lock()
        self._close_asked = False

    def encode(self, samples: Int16Array) -> bytes:
        with self._lock:
            data = b"" if self._closed else self._encode(samples)
        if self._close_asked:  # read after the lock is free: close() could not take it
            self.close()
        return data

    def _encode(self, samples: Int16Array) -> bytes:
        if samples.size:
            pcm = np.ascontiguousarray(samples, dtype=np.int16).reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
            frame.sample_rate = self._rate
            frame.pts = self._pts
            self._pts += samples.size
            self._container.mux(self._stream.encode(frame))
        return self._sink.take()

    def finish(self) -> bytes:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._container.mux(self._stream.encode(None))
                self._container.close()
            return self._sink.take()

    def close(self) -> None:
        """Never waits for an encode() in another thread: that call closes when it ends."""
        self._close_asked = True
        if not self._lock.acquire(blocking=False):
            return  # encode() holds it and reads _close_asked once it lets go
        try:
            if not self._closed:
                self._closed = True
                self._container.close()
        finally:
            self._lock.release()

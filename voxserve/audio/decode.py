"""Uploaded audio files in any container and codec FFmpeg reads (WAV, MP3, M4A/AAC, Ogg/Opus,
WebM, FLAC, ...), decoded from memory by PyAV into 16 kHz mono int16, resampled once.

No temp file: PyAV reads the bytes through a BytesIO. Bounded before the work: a file whose
header declares more than `max_seconds` (FLAC of hours of silence, 2 h of Opus in 3 MB) is
refused on opening, before a frame is decoded; one that declares nothing, or lies, is
decoded a window at a time (`UploadDecoder`), each frame's length known before it is
resampled, and stops at the limit instead of filling memory.

Every failure is the client's: FFmpeg's errors, and PyAV's own on damaged input (an
IndexError on a corrupt MP4 box table), become `invalid_audio` with FFmpeg's reason. A file
cut short often still decodes, so the decoded length is compared with the length the file
declares (MP3's Xing/Info header, MP4's sample table, FLAC's STREAMINFO, WebM's Duration,
WAV's data size, Ogg's last page): one missing more than a few frames is refused as
truncated rather than transcribed in part. Formats that declare no length (raw ADTS AAC,
MP3 without a Xing/Info/VBRI header) cannot be told from a shorter file and are decoded as
they are: FFmpeg still reports a length for them, guessed from the file size and the first
frames' bit rate, which for a variable rate (a quiet start) is many times the real one.

Nothing but the upload is read: some demuxers open other files named inside the one they
read (an ffconcat list `file secret.wav` reads a file beside the server's working
directory, an HLS playlist fetches URLs), so FFmpeg is opened with no protocol allowed and
such a list is refused as undecodable. Only audio decoders may be opened: FFmpeg decodes a
first frame of every stream to learn its format, and a video stream's one frame can be an
image of gigabytes in a file of kilobytes (a PNG of one colour); an upload's video (an mp4
or webm with a picture) is skipped without being decoded.
"""

from __future__ import annotations

import io
import math
import struct
import threading
from collections.abc import Iterator
from fractions import Fraction
from typing import Any, Literal

import av
import numpy as np
import numpy.typing as npt

from voxserve.audio.pcm import Int16Array
from voxserve.errors import ErrorCode, VoxError
from voxserve.types import SAMPLE_RATE

TRUNCATION_SLACK_S = 0.25  # encoder delay, padding and priming differ by a few frames
TRUNCATION_SLACK = 0.02  # ...and by a small share of a long file
WINDOW_S = 20.0  # audio decoded per window (~20-60 ms of a core): the unit of turns and reserves
MIN_SOURCE_RATE = 1_000  # lower rates are no audio anyone records; 1 Hz up to 16 kHz is 16,000x

SampleFormat = Literal["s16", "flt"]


def _audio_decoders() -> str:
    names = []
    for name in av.codecs_available:
        try:
            codec = av.Codec(name, "r")
        except Exception:  # an encoder only
            continue
        if codec.type == "audio":
            names.append(name)
    return ",".join(sorted(names))


OPEN_OPTIONS = {  # (module docstring)
    "protocol_whitelist": "none",  # no nested file or network opens
    "codec_whitelist": _audio_decoders(),  # no video frame decoded while probing
}
WAV_UNKNOWN_SIZES = (0, 0xFFFFFFFF, 0xFFFFFFFF - 36, 0x7FFFFFFF)  # streamed WAV headers
OGG_EOS = 0x04
MP3_HEADER_SPAN = 64  # a Xing/Info tag sits after the side info, VBRI at byte 36


def decode_audio(data: bytes, *, max_seconds: float, rate: int = SAMPLE_RATE) -> Int16Array:
    """Mono int16 samples at `rate` from an audio file's bytes (module docstring), decoded
    whole in this thread (small files: a voice prompt; uploads go window by window)."""
    decoder = UploadDecoder(data, max_seconds=max_seconds, rate=rate)
    try:
        while not decoder.done:
            decoder.decode_window(max(decoder.next_window, int(WINDOW_S * rate)))
        samples: Int16Array = decoder.finish()
        return samples
    finally:
        decoder.close()


class UploadDecoder:
    """One upload, decoded a window at a time (`decode_window`, in a worker thread), so the
    caller can reserve each window's bytes before they exist, give other uploads their turn
    between windows, and stop (`stop`) when the client has gone.

    Opening reads only the header: a file that declares more than `max_seconds` is refused
    there (413 `message_too_large`) before any audio is decoded. What it declares
    (`declared_s`, None when it declares nothing FFmpeg does not guess) is what it should
    hold; a header that lies is still stopped at `max_seconds` as it decodes. Samples are
    mono at `rate`, int16 or (`dtype="flt"`) float32 in -1..1, as the ASR reads them."""

    def __init__(
        self,
        data: bytes,
        *,
        max_seconds: float,
        rate: int = SAMPLE_RATE,
        dtype: SampleFormat = "s16",
    ) -> None:
        if not data:
            raise VoxError(ErrorCode.EMPTY_AUDIO, "the audio file is empty")
        self.max_seconds = max_seconds
        self.rate = rate
        self.itemsize = 2 if dtype == "s16" else 4
        self.samples = 0  # decoded so far
        self.done = False
        self._format = dtype
        self._limit = int(max_seconds * rate)
        self._chunks: list[npt.NDArray[Any]] = []  # one array per window
        self._pending: av.AudioFrame | None = None  # a frame that did not fit the last window
        self._lock = threading.Lock()
        self._running = False
        self._stopped = False
        self._container: av.container.InputContainer | None = None
        try:
            container = av.open(
                io.BytesIO(data), mode="r", options=OPEN_OPTIONS, metadata_errors="ignore"
            )
            self._container = container
            if not container.streams.audio:
                raise VoxError(ErrorCode.INVALID_AUDIO, "the file holds no audio stream")
            stream = container.streams.audio[0]
            declared = _declared_seconds(container.duration, stream.duration, stream.time_base)
            if _length_is_a_guess(container.format.name, data):
                declared = None
            self.kind = f"{container.format.name}/{stream.codec_context.name}"
            self._frames: Iterator[av.AudioFrame] = iter(container.decode(stream))
            self._resampler = _Resampler(rate, dtype)
        except VoxError:
            self.close()
            raise
        except Exception as exc:  # FFmpeg's errors and PyAV's own on damaged input alike
            self.close()
            raise _undecodable(exc) from exc
        own = _own_declared_seconds(data)
        self._declared = own if own is not None else declared  # what the length check uses
        finite = self._declared is not None and math.isfinite(self._declared)
        self.declared_s = self._declared if finite else None
        if self.declared_s is not None and own is not None and data[:4] == b"RIFF":
            present = _wav_seconds(data, present=True) or 0.0
            if self.declared_s > present + TRUNCATION_SLACK_S:  # cut short, or a lie: damage
                self.close()
                raise VoxError(
                    ErrorCode.INVALID_AUDIO,
                    f"the {self.kind} file is truncated or damaged: it declares "
                    f"{self.declared_s:.2f} s of audio but holds at most {present:.2f} s",
                )
        if self.declared_s is not None and self.declared_s > max_seconds + TRUNCATION_SLACK_S:
            self.close()
            raise _too_long(max_seconds, declared=self.declared_s)

    @property
    def next_window(self) -> int:
        """Samples the next window may add beyond those asked for: a frame held back from
        the last window (it is resampled whole)."""
        return _out_samples(self._pending, self.rate) if self._pending is not None else 0

    def decode_window(self, max_samples: int) -> int:
        """Decode up to `max_samples` more samples (a frame that would pass them waits for
        the next window, unless the window is empty); returns the samples added. Sets
        `done` at the end of the file; raises 413 past `max_seconds`."""
        with self._lock:
            if self._stopped or self.done:
                return 0
            self._running = True
        pieces: list[npt.NDArray[Any]] = []
        added = 0
        try:
            while not self._stopped:
                frame = self._pending if self._pending is not None else next(self._frames, None)
                self._pending = None
                if frame is None:
                    added += self._add(self._resampler.flush(), pieces)
                    self.done = True
                    break
                coming = _out_samples(frame, self.rate)
                if self.samples + added + coming > self._limit + self.rate:  # 1 s of slack
                    raise _too_long(self.max_seconds)
                if added and added + coming > max_samples:
                    self._pending = frame
                    break
                added += self._add(self._resampler.resample(frame), pieces)
                if added >= max_samples:
                    break
            if pieces:  # one array a window: the join frees whole windows as it copies
                self._chunks.append(np.concatenate(pieces) if len(pieces) > 1 else pieces[0])
                self.samples += added
            if self.samples > self._limit:
                raise _too_long(self.max_seconds)
        except VoxError:
            raise
        except Exception as exc:  # FFmpeg's errors and PyAV's own on damaged input alike
            raise _undecodable(exc) from exc
        finally:
            with self._lock:
                self._running = False
                stopped = self._stopped
            if stopped:
                self._close_container()
        return added

    def finish(self) -> npt.NDArray[Any]:
        """The samples as one array, once `done`; a file that decodes to much less than it
        declares is refused as truncated (module docstring). Joined a window at a time, each
        freed once copied: the join costs one window more, not the whole again."""
        if self.samples == 0:
            raise VoxError(ErrorCode.EMPTY_AUDIO, "the audio file holds no audio samples")
        if len(self._chunks) == 1:
            samples = self._chunks.pop()
        else:
            samples = np.empty(self.samples, dtype=self._chunks[0].dtype)
            at = 0
            for index, chunk in enumerate(self._chunks):
                samples[at : at + chunk.size] = chunk
                at += chunk.size
                self._chunks[index] = _EMPTY
            self._chunks.clear()
        declared = self._declared
        decoded = samples.size / self.rate
        if (
            declared is not None
            and decoded < declared * (1 - TRUNCATION_SLACK) - TRUNCATION_SLACK_S
        ):
            claim = (
                "no complete last page" if math.isinf(declared) else f"{declared:.2f} s of audio"
            )
            raise VoxError(
                ErrorCode.INVALID_AUDIO,
                f"the {self.kind} file is truncated or damaged: it declares {claim} "
                f"but only {decoded:.2f} s could be decoded",
            )
        return samples

    def stop(self) -> None:
        """Stop decoding (the client has gone): a window running in a thread ends at its next
        frame and closes the file there; otherwise it is closed now."""
        with self._lock:
            self._stopped = True
            running = self._running
        if not running:
            self.close()

    def close(self) -> None:
        """Free the file and the samples (not while a window decodes: `stop` is for that)."""
        self._chunks.clear()
        self._pending = None
        self._close_container()

    def _close_container(self) -> None:
        container, self._container = self._container, None
        if container is not None:
            container.close()

    @staticmethod
    def _add(frames: list[av.AudioFrame], pieces: list[npt.NDArray[Any]]) -> int:
        added = 0
        for out in frames:
            chunk = out.to_ndarray().reshape(-1)
            if chunk.size:
                pieces.append(chunk.copy())  # the frame's buffer is the resampler's
                added += chunk.size
        return added


_EMPTY = np.zeros(0, dtype=np.int16)


def _out_samples(frame: av.AudioFrame, rate: int) -> int:
    """How many samples `frame` becomes at `rate`: known before it is resampled, and a rate
    under MIN_SOURCE_RATE refused (1 Hz to 16 kHz makes 16,000 samples of each one)."""
    if frame.sample_rate < MIN_SOURCE_RATE:
        raise VoxError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"the file's sample rate {frame.sample_rate} Hz is under {MIN_SOURCE_RATE} Hz",
        )
    return math.ceil(frame.samples * rate / frame.sample_rate) + 1


def _undecodable(exc: Exception) -> VoxError:
    return VoxError(ErrorCode.INVALID_AUDIO, f"the audio file could not be decoded: {_reason(exc)}")


class _Resampler:
    """PyAV's AudioResampler is set up by the first frame and refuses a frame of another
    rate, channel layout or sample format; a stream may change them mid-way (joined ADTS or
    MP3 files, a chained Ogg stream), which FFmpeg decodes. On a change the resampler so far
    is flushed and a new one follows."""

    def __init__(self, rate: int, dtype: SampleFormat = "s16") -> None:
        self._rate = rate
        self._format = dtype
        self._source: tuple[str, str, int] | None = None
        self._resampler = av.AudioResampler(format=dtype, layout="mono", rate=rate)

    def resample(self, frame: av.AudioFrame) -> list[av.AudioFrame]:
        if frame.layout.name.endswith(" channels"):
            frame = _mixed_down(frame)
        source = (frame.format.name, frame.layout.name, frame.sample_rate)
        flushed: list[av.AudioFrame] = []
        if self._source is not None and source != self._source:
            flushed = self.flush()
            self._resampler = av.AudioResampler(format=self._format, layout="mono", rate=self._rate)
        self._source = source
        return flushed + self._resampler.resample(frame)

    def flush(self) -> list[av.AudioFrame]:
        return self._resampler.resample(None) if self._source is not None else []


_FULL_SCALE = {"u8": 128.0, "s16": 32768.0, "s32": 2.0**31, "s64": 2.0**63}


def _mixed_down(frame: av.AudioFrame) -> av.AudioFrame:
    """A frame of channels without named positions ("9 channels": a WAV without a channel
    mask, a microphone array), averaged to one here: FFmpeg's resampler has no mix for such
    a layout and refuses it (and PyAV crashes converting one)."""
    kind = frame.format.name.rstrip("p")
    data = frame.to_ndarray().astype(np.float64)
    channels = len(frame.layout.channels)
    planes = data if frame.format.is_planar else data.reshape(-1, channels).T
    if kind == "u8":
        planes = planes - 128.0
    mono = (planes.mean(axis=0) / _FULL_SCALE.get(kind, 1.0)).astype(np.float32)
    out = av.AudioFrame.from_ndarray(mono.reshape(1, -1), format="flt", layout="mono")
    out.sample_rate = frame.sample_rate
    return out


def _too_long(max_seconds: float, *, declared: float | None = None) -> VoxError:
    said = f" (its header declares {declared:.0f} s)" if declared is not None else ""
    return VoxError(
        ErrorCode.MESSAGE_TOO_LARGE,
        f"the audio is longer than {max_seconds:.0f} s, the most an upload may hold{said}",
    )


def _reason(exc: Exception) -> str:
    if isinstance(exc, av.FFmpegError) and exc.strerror:
        return str(exc.strerror)
    if isinstance(exc, EOFError):
        return "the file ends before its first audio"
    return "the file is damaged or not an audio format FFmpeg reads"


def _declared_seconds(
    container_us: int | None, stream_duration: int | None, time_base: Fraction | None
) -> float | None:
    """The length FFmpeg read from the file's header, if any."""
    if stream_duration and time_base:
        return float(stream_duration * time_base)
    if container_us:
        return container_us / 1_000_000
    return None


def _length_is_a_guess(format_name: str, data: bytes) -> bool:
    """FFmpeg's length of a file whose header states none is a bit-rate guess (docstring)."""
    if format_name == "aac":  # raw ADTS: no length anywhere
        return True
    if format_name == "mp3":
        start = 0
        if data[:3] == b"ID3" and len(data) >= 10:  # ID3v2: a 4-byte syncsafe size
            size = data[6] << 21 | data[7] << 14 | data[8] << 7 | data[9]
            start = 10 + size + (10 if data[5] & 0x10 else 0)  # + footer, if flagged
        first_frame = data[start : start + MP3_HEADER_SPAN]
        return not any(tag in first_frame for tag in (b"Xing", b"Info", b"VBRI"))
    return False


def _own_declared_seconds(data: bytes) -> float | None:
    """A length FFmpeg does not keep: it shortens a WAV's data size to what is present and
    takes an Ogg file's length from whatever page comes last."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return _wav_seconds(data)
    if data[:4] == b"OggS":
        return _ogg_seconds(data)
    return None


def _wav_seconds(data: bytes, *, present: bool = False) -> float | None:
    """The duration a WAV's fmt and data chunks declare (None for a streamed size), or with
    `present` the most its bytes can hold: a header that declares more than the file holds
    is a damaged file, refused as truncated after decoding what is there, not as too long."""
    offset = 12
    byte_rate = 0
    while offset + 8 <= len(data):
        chunk, size = struct.unpack_from("<4sI", data, offset)
        if chunk == b"fmt " and offset + 24 <= len(data):
            rate, byte_rate, block = struct.unpack_from("<IIH", data, offset + 12)
            byte_rate = byte_rate or rate * block  # some writers leave byte_rate 0
        if chunk == b"data":
            if size in WAV_UNKNOWN_SIZES or byte_rate <= 0:
                return None
            if present:
                size = min(size, len(data) - offset - 8)
            return float(size / byte_rate)
        offset += 8 + size + (size & 1)
    return None


def _ogg_seconds(data: bytes) -> float:
    """An Ogg stream's length from its last page: a stream cut short has no complete
    end-of-stream page, so it declares more than is there (infinity: refused)."""
    start = data.rfind(b"OggS")
    header = data[start : start + 27]
    if len(header) < 27:
        return float("inf")
    flags = header[5]
    granule = struct.unpack_from("<q", header, 6)[0]
    count = header[26]
    lacing = data[start + 27 : start + 27 + count]
    complete = len(lacing) == count and start + 27 + count + sum(lacing) == len(data)
    if not complete or not flags & OGG_EOS or granule < 0:
        return float("inf")
    return granule / 48_000 if b"OpusHead" in data[:200] else _vorbis_seconds(data, granule)


def _vorbis_seconds(data: bytes, granule: int) -> float:
    """Vorbis and FLAC-in-Ogg count granules in samples at the stream's own rate."""
    head = data.find(b"\x01vorbis")
    if head >= 0 and head + 16 <= len(data):
        rate = struct.unpack_from("<I", data, head + 12)[0]
        if rate > 0:
            return float(granule / rate)
    return 0.0  # unknown rate: trust what decodes

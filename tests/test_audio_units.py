"""Pure audio pieces: ring buffer, dedup window, stream audio, PCM, WAV, resampling."""

from __future__ import annotations

import numpy as np
import pytest

from voxserve.audio.dedup import SEQ_MOD, SeqDedup
from voxserve.audio.pcm import int16_from_bytes, to_float32, to_int16
from voxserve.audio.resample import StreamResampler, check_rate, resample
from voxserve.audio.ring import RingFull, SampleRing
from voxserve.audio.stream_audio import StreamAudio
from voxserve.audio.wav import read_wav, wav_header, write_wav
from voxserve.errors import ErrorCode, VoxError


def test_ring_wraps_and_keeps_order() -> None:
    ring = SampleRing(10)
    ring.write(np.arange(6, dtype=np.int16))
    assert ring.read(4).tolist() == [0, 1, 2, 3]
    ring.write(np.arange(6, 14, dtype=np.int16))  # wraps around the end
    assert len(ring) == 10 and ring.free == 0
    assert ring.read().tolist() == [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert ring.read_total == ring.write_total == 14


def test_ring_full_waits_or_drops_oldest_counted() -> None:
    ring = SampleRing(8)
    ring.write(np.arange(8, dtype=np.int16))
    with pytest.raises(RingFull):
        ring.write(np.array([99], dtype=np.int16))
    assert ring.write(np.array([8, 9, 10], dtype=np.int16), drop_oldest=True) == 3
    assert ring.dropped_samples == 3
    assert ring.read().tolist() == [3, 4, 5, 6, 7, 8, 9, 10]


def test_ring_takes_pcm_bytes_without_an_array() -> None:
    ring = SampleRing(10)
    pcm = np.arange(6, dtype="<i2").tobytes()
    assert ring.write_pcm(memoryview(pcm))
    assert ring.read(4).tolist() == [0, 1, 2, 3]
    wrap = np.arange(6, 14, dtype="<i2").tobytes()
    assert ring.write_pcm(memoryview(wrap))  # wraps around the end
    assert ring.read().tolist() == list(range(4, 14))
    ring.write_pcm(memoryview(np.arange(10, dtype="<i2").tobytes()))
    assert not ring.write_pcm(memoryview(b"\x01\x00"))  # full: nothing written
    assert len(ring) == 10 and ring.read().tolist() == list(range(10))
    ring.detach()
    assert ring.write_pcm(memoryview(pcm)) and len(ring) == 0  # a finished session's ring


def test_dedup_window_expires_after_500ms() -> None:
    dedup = SeqDedup(0.5)
    assert dedup.accept(1, 0.0)
    assert not dedup.accept(1, 0.2)
    assert dedup.duplicates == 1
    assert not dedup.accept(1, 0.45)
    assert dedup.accept(1, 1.2)  # remembered ids expire after the window
    assert dedup.duplicates == 2


def test_dedup_counts_gaps_and_late_frames_across_wrap() -> None:
    dedup = SeqDedup(0.5)
    for seq in (SEQ_MOD - 2, SEQ_MOD - 1, 1):  # 0 skipped across the wrap
        assert dedup.accept(seq, 0.0)
    assert dedup.gaps == 1
    assert dedup.accept(0, 0.01)  # the late one fills the gap
    assert dedup.gaps == 0 and dedup.reordered == 1


def test_dedup_memory_is_bounded_by_the_window() -> None:
    dedup = SeqDedup(0.5)
    for seq in range(10_000):
        dedup.accept(seq, seq * 0.02)
    # 500 ms of 20 ms frames, expired once per quarter window: at most 625 ms remembered.
    assert 25 <= len(dedup) <= 32


def test_dedup_expires_in_quarter_window_steps() -> None:
    dedup = SeqDedup(0.5)
    assert dedup.accept(1, 0.0)
    assert dedup.accept(2, 0.3)  # expiry ran at 0.0 and 0.3 (due every 0.125 s)
    assert not dedup.accept(1, 0.49)  # inside the window: a duplicate
    assert dedup.accept(1, 0.63)  # 630 ms later: forgotten (at most 1.25 windows)


def test_stream_audio_slices_by_absolute_position() -> None:
    audio = StreamAudio()
    audio.append(np.arange(0, 100, dtype=np.int16))
    audio.append(np.arange(100, 250, dtype=np.int16))
    assert audio.slice(90, 110).tolist() == list(range(90, 110))
    audio.trim(120)
    assert audio.start == 100 and audio.slice(0, 105).tolist() == list(range(100, 105))
    assert audio.slice(300, 400).size == 0


def test_pcm_conversions_and_odd_length() -> None:
    samples = int16_from_bytes(np.array([0, 16384, -32768], dtype="<i2").tobytes())
    assert to_float32(samples).tolist() == [0.0, 0.5, -1.0]
    assert to_int16(np.array([2.0, -2.0], dtype=np.float32)).tolist() == [32767, -32767]
    with pytest.raises(VoxError) as err:
        int16_from_bytes(b"\x00\x00\x00")
    assert err.value.code is ErrorCode.ODD_LENGTH_PCM


def test_wav_round_trip_and_errors() -> None:
    samples = (np.sin(np.arange(1600) / 5) * 1000).astype(np.int16)
    decoded, rate = read_wav(write_wav(samples, 22050))
    assert rate == 22050 and np.array_equal(decoded, samples)
    for data, code in [
        (b"", ErrorCode.EMPTY_AUDIO),
        (b"ID3 not a wav at all", ErrorCode.INVALID_AUDIO),
        (write_wav(np.zeros(0, dtype=np.int16), 16000), ErrorCode.EMPTY_AUDIO),
    ]:
        with pytest.raises(VoxError) as err:
            read_wav(data)
        assert err.value.code is code
    assert len(wav_header(16000)) == 44


def test_stereo_wav_is_downmixed() -> None:
    import io
    import wave

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(16000)
        wav.writeframes(np.array([100, 300] * 50, dtype="<i2").tobytes())
    mono, _ = read_wav(buffer.getvalue())
    assert mono.size == 50 and set(mono.tolist()) == {200}


def test_resampling_keeps_duration_and_pitch() -> None:
    t = np.arange(48000) / 48000
    sine = (np.sin(2 * np.pi * 1000 * t) * 10000).astype(np.int16)
    out = resample(sine, 48000, 16000)
    assert out.size == 16000
    peak = np.argmax(np.abs(np.fft.rfft(out)))
    assert abs(peak - 1000) <= 2
    stream = StreamResampler(48000, 16000)
    pieces = [stream.process(sine[i : i + 960]) for i in range(0, sine.size, 960)]
    total = sum(p.size for p in pieces) + stream.flush().size
    assert abs(total - 16000) <= 2
    with pytest.raises(VoxError) as err:
        check_rate(44100)
    assert err.value.code is ErrorCode.UNSUPPORTED_SAMPLE_RATE

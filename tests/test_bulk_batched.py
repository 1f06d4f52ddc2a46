"""Uploads decoded in shared batches (issue 23): through the cross-session ASR batcher, a
long recording cut at its pauses by the VAD engine, the silence between them skipped,
segments back on the recording's time line. The official `openai` SDK against the
session's real server (silero + whisper tiny.en).

What the engine is handed is read by wrapping the batcher's engine call (`run_bulk`): the
real Whisper still runs every batch; the wrapper only records each batch's windows.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np
import openai
import pytest

from tests.conftest import LiveServer
from tests.helpers import async_sdk, fixture_audio, fixture_texts, wer
from voxserve.audio.wav import write_wav
from voxserve.pipeline.recognition import bulk as recognition
from voxserve.pipeline.scheduling.asr_batch import AsrBatcher

RATE = 16_000
UPLOADS = 6
# Pauses between the long recording's utterances (s), one of them a long silence: VAD
# regions end in each, and the 8 s one is never decoded.
PAUSES_S = (1.2, 2.0, 8.0, 1.5, 2.5, 1.0, 1.8, 1.3)
QUIET_RMS = 0.01  # a window's first and last 50 ms are at most this loud: cut in a pause
TOLERANCE_S = 0.6  # Whisper's timestamps (20 ms tokens) may land this far off speech


@pytest.fixture
async def client(live_server: LiveServer) -> AsyncIterator[openai.AsyncOpenAI]:
    """Closed on the test's own loop (the fixture's loop is the test's)."""
    async with async_sdk(live_server, "x", timeout=120.0) as sdk:
        yield sdk


@pytest.fixture
def batches(live_server: LiveServer) -> Iterator[tuple[AsrBatcher, list[list[np.ndarray]]]]:
    """The server's ASR batcher, and every bulk batch's windows as the engine gets them."""
    batcher = live_server.runtime.generation.asr_batcher()
    assert batcher is not None
    seen: list[list[np.ndarray]] = []
    real: Callable[[list[Any]], list[Any]] = batcher.run_bulk

    def recording(items: list[Any]) -> list[Any]:
        seen.append([audio for audio, *_ in items])
        return real(items)

    batcher.run_bulk = recording
    yield batcher, seen
    batcher.run_bulk = real


def _wav(samples: np.ndarray) -> tuple[str, bytes]:
    return ("speech.wav", write_wav(samples, RATE))


async def test_six_concurrent_uploads_share_engine_batches(
    client: openai.AsyncOpenAI,
    batches: tuple[AsrBatcher, list[list[np.ndarray]]],
    live_server: LiveServer,
) -> None:
    """Six uploads at once go to Whisper in shared bulk batches (fewer calls than uploads,
    one batch with several of them), each observed as `voxserve_engine_batch_size`, and
    each upload gets its own transcript back."""
    batcher, seen = batches
    texts = fixture_texts()
    names = list(texts)[:UPLOADS]
    bulk_before, requests_before = batcher.bulk_batches, batcher.requests
    observed_before = _batch_count(live_server)

    async def upload(name: str) -> str:
        result = await client.audio.transcriptions.create(
            model="whisper-1", file=_wav(fixture_audio(name))
        )
        return result.text

    results = await asyncio.gather(*(upload(name) for name in names))
    for name, text in zip(names, results, strict=True):
        assert wer(texts[name], text) <= 0.25, (name, text)
    bulk = batcher.bulk_batches - bulk_before
    assert batcher.requests - requests_before == UPLOADS
    assert 1 <= bulk < UPLOADS, bulk
    assert max(len(batch) for batch in seen) > 1
    assert _batch_count(live_server) - observed_before == bulk


def _batch_count(live: LiveServer) -> float:
    """How many ASR batches /metrics has observed (`voxserve_engine_batch_size`)."""
    import httpx

    for line in httpx.get(live.http_url + "/metrics").text.splitlines():
        if line.startswith("voxserve_engine_batch_size_count") and 'engine="asr"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_long_recording_is_cut_at_its_pauses_and_stitched_back(
    client: openai.AsyncOpenAI,
    batches: tuple[AsrBatcher, list[list[np.ndarray]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nine fixture utterances with pauses (one of 8 s), ~52 s: the windows Whisper gets
    are at most asr.bulk_window_s, start and end in silence, and hold less audio than the
    recording (the long pause is skipped); the segments come back monotonic, within the
    audio, starting and ending on speech, and the words of each utterance in the segments
    over its span. Its first 10 s are windowed first (recognition.HEAD_S, 60 s in service,
    made short here), so the region open at that point is judged again with the rest. (A
    segment may cover two utterances: Whisper need not break a segment where two pieces of
    a window meet, as with faster-whisper's batched pipeline.)"""
    _, seen = batches
    monkeypatch.setattr(recognition, "HEAD_S", 10.0)
    texts = fixture_texts()
    names = list(texts)
    parts: list[np.ndarray] = []
    spans: list[tuple[float, float, str]] = []  # (start s, end s, text) of each utterance
    at = 0
    for k, pause_s in enumerate((*PAUSES_S, 0.5)):
        speech = fixture_audio(names[k % len(names)])
        spans.append((at / RATE, (at + speech.size) / RATE, texts[names[k % len(names)]]))
        pause = np.zeros(int(pause_s * RATE), dtype=np.int16)
        parts += [speech, pause]
        at += speech.size + pause.size
    recording = np.concatenate(parts)
    duration = recording.size / RATE

    result = await client.audio.transcriptions.create(
        model="whisper-1",
        file=_wav(recording),
        response_format="verbose_json",
        timestamp_granularities=["segment"],
    )
    windows = [audio for batch in seen for audio in batch]
    limit = 7.0 * RATE  # asr.bulk_window_s (default)
    assert len(windows) >= 3 and all(w.size <= limit for w in windows)
    assert sum(w.size for w in windows) < recording.size - 7 * RATE  # the 8 s pause skipped
    edge = RATE // 20
    for window in windows:  # int16 as uploads are held (float32 only in the engine's thread)
        level = window.astype(np.float32) / (32768.0 if window.dtype == np.int16 else 1.0)
        for part in (level[:edge], level[-edge:]):
            assert float(np.sqrt(np.mean(np.square(part)))) <= QUIET_RMS

    expected = " ".join(text for *_, text in spans)
    assert wer(expected, result.text) <= 0.15
    segments = result.segments or []
    starts = [s.start for s in segments]
    assert starts == sorted(starts) and len(segments) >= len(spans) // 2

    def on_speech(t: float) -> bool:
        return any(a - TOLERANCE_S <= t <= b + TOLERANCE_S for a, b, _ in spans)

    for segment in segments:  # both ends on speech, never in the silence skipped
        assert 0.0 <= segment.start <= segment.end <= duration + 0.01
        assert on_speech(segment.start) and on_speech(segment.end), segment
    for start, end, text in spans:  # each utterance's words in the segments over it
        said = _words(
            " ".join(
                s.text
                for s in segments
                if s.start <= end + TOLERANCE_S and s.end >= start - TOLERANCE_S
            )
        )
        words = _words(text)
        found = sum(1 for word in words if word in said)
        assert found >= 0.75 * len(words), (start, end, text, said)


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()

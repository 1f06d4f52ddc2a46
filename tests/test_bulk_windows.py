"""The parts of batched uploads that need no model (issue 23): speech regions from VAD
probabilities, regions packed into windows and times mapped back
(pipeline/recognition/speech_windows.py, as properties over generated recordings), and bulk batches
in the batcher (kinds never mixed, bounded by audio and count, earliest deadline first, never joined
with live finals).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fakes import FakeAsr, tone
from voxserve.audio.pcm import to_float32
from voxserve.pipeline.recognition.speech_windows import (
    PAD_S,
    SpeechWindow,
    pack_windows,
    speech_regions,
)
from voxserve.pipeline.scheduling.asr_batch import AsrBatcher
from voxserve.pipeline.scheduling.batcher import BULK_GATHER_MAX_S, BULK_GATHER_S
from voxserve.pipeline.scheduling.executor import AdaptiveExecutor
from voxserve.pipeline.scheduling.stage import EngineStage
from voxserve.types import SAMPLE_RATE, AsrResult

WIDTH = 512  # silero's window


@st.composite
def speech_probs(draw: st.DrawFn) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Runs of speech (prob 0.9) and silence (0.05), in VAD windows; the speech runs."""
    probs: list[float] = []
    runs: list[tuple[int, int]] = []
    for _ in range(draw(st.integers(1, 20))):
        quiet = draw(st.integers(10, 200))
        probs += [0.05] * quiet
        speech = draw(st.integers(3, 600))
        runs.append((len(probs), len(probs) + speech))
        probs += [0.9] * speech
    probs += [0.05] * draw(st.integers(0, 50))
    return np.array(probs, dtype=np.float32), runs


@settings(max_examples=150, deadline=None)
@given(drawn=speech_probs(), max_s=st.sampled_from([5.0, 14.0, 30.0]))
def test_regions_hold_all_speech_and_windows_pack_them_in_order(
    drawn: tuple[np.ndarray, list[tuple[int, int]]], max_s: float
) -> None:
    probs, runs = drawn
    total = probs.size * WIDTH
    regions = speech_regions(probs, WIDTH, total, threshold=0.5, neg_threshold=0.35)
    # in order, apart, within the recording; every speech run inside one region, padded
    assert all(a < b for a, b in regions)
    assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(regions))
    assert regions[0][0] >= 0 and regions[-1][1] <= total
    pad = int(PAD_S * SAMPLE_RATE)
    for first, last in runs:
        begin, end = first * WIDTH, last * WIDTH
        assert any(a <= max(0, begin - pad) and min(total, end + pad) <= b for a, b in regions), (
            begin,
            end,
            regions,
        )
    # windows: at most max_s of audio each, their pieces exactly the regions, in order
    audio = np.zeros(total, dtype=np.float32)
    windows = pack_windows(audio, regions, max_s)
    assert all(0 < w.size <= int(max_s * SAMPLE_RATE) for w in windows)
    pieces = [piece for w in windows for piece in w.pieces]
    merged: list[tuple[int, int]] = []
    for a, b in pieces:  # a region cut into several pieces joins back whole
        if merged and merged[-1][1] == a:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    assert merged == regions


def test_window_times_map_back_onto_the_recording() -> None:
    second = SAMPLE_RATE
    window = SpeechWindow(((2 * second, 4 * second), (10 * second, 13 * second)))
    assert window.size == 5 * second
    assert window.to_recording_ms(0) == 2_000
    assert window.to_recording_ms(1_500) == 3_500
    assert window.to_recording_ms(2_000) == 10_000  # a start on the seam: the second piece
    assert window.to_recording_ms(2_000, closing=True) == 4_000  # an end: the first's end
    assert window.to_recording_ms(4_500, closing=True) == 12_500
    assert window.to_recording_ms(9_000, closing=True) == 13_000  # past the end: clipped
    recording = np.arange(14 * second, dtype=np.float32)
    joined = window.audio(recording)
    assert joined.size == window.size and joined[2 * second] == 10 * second


class _BatchingAsr(FakeAsr):
    """FakeAsr with a batched call that records each batch's sizes (samples), and Whisper's
    encoder windows (`window_for`), so the batcher groups bulk windows by them."""

    def __init__(self) -> None:
        super().__init__(delay_s=0.05)
        self.batches: list[list[int]] = []
        self.hinted: list[bool] = []  # each batch's turn_hints

    def window_for(self, seconds: float) -> int:
        return 10 if seconds <= 7 else 20

    def transcribe_many(
        self,
        audios: list[np.ndarray],
        *,
        language: str | None = None,
        partial: bool = False,
        turn_hints: bool = True,
    ) -> list[AsrResult]:
        self.batches.append([a.size for a in audios])
        self.hinted.append(turn_hints)
        return [self.transcribe(a, language=language, partial=partial) for a in audios]


async def test_bulk_batches_group_one_kind_within_their_bounds_and_never_live() -> None:
    """Bulk windows of two encoder windows (3 s and 12 s) and live finals at once: no batch
    mixes bulk with live or 3 s with 12 s windows; bulk batches hold at most bulk_batch_s
    of audio; every request gets its own answer."""
    executor = AdaptiveExecutor(min_workers=1, max_workers=3, idle_release_s=30)
    asr = _BatchingAsr()
    stage = EngineStage("asr", concurrency=2, timeout_s=5.0, executor=executor)
    batcher = AsrBatcher(
        asr, stage, max_wait_ms=0, max_batch=4, bulk_batch_s=30.0, max_bulk_batch=8
    )
    now = time.monotonic()
    short = [to_float32(tone(300 + 100 * k, 3.0)) for k in range(6)]
    long = [to_float32(tone(1000 + 100 * k, 12.0)) for k in range(4)]
    bulk = [
        batcher.bulk(clip, "en", deadline=now + k, expires=now + 30)
        for k, clip in enumerate([*long, *short])
    ]
    live = [batcher.final(to_float32(tone(250, 1.0)), "en", deadline=None) for _ in range(3)]
    results = await asyncio.gather(*bulk, *live)
    assert [r.text for r in results[:10]] == [
        f"tone{f}" for f in [1000, 1100, 1200, 1300, 300, 400, 500, 600, 700, 800]
    ]
    live_size = to_float32(tone(250, 1.0)).size
    for sizes in asr.batches:
        assert len(set(sizes)) == 1, sizes  # one kind: bulk 3 s, bulk 12 s or live 1 s
        if sizes[0] != live_size:
            assert sum(sizes) <= 30 * SAMPLE_RATE
    assert batcher.bulk_batches == 2 + 1, asr.batches  # 12 s windows two by two, 3 s together
    # Only live finals ask for turn-end hints (an upload's windows end no turn).
    assert [hinted for sizes, hinted in zip(asr.batches, asr.hinted, strict=True)] == [
        sizes[0] == live_size for sizes in asr.batches
    ]
    batcher.close()
    executor.shutdown()


@pytest.fixture
def idle_bulk() -> Iterator[tuple[AsrBatcher, _BatchingAsr]]:
    """An idle batcher on a fake engine that records its batches."""
    executor = AdaptiveExecutor(min_workers=1, max_workers=2, idle_release_s=30)
    asr = _BatchingAsr()
    stage = EngineStage("asr", concurrency=2, timeout_s=5.0, executor=executor)
    batcher = AsrBatcher(asr, stage, max_wait_ms=0, max_batch=4, bulk_batch_s=30.0)
    yield batcher, asr
    batcher.close()
    executor.shutdown()


async def test_an_idle_engine_waits_for_bulk_company_only_when_some_is_admitted(
    idle_bulk: tuple[AsrBatcher, _BatchingAsr],
) -> None:
    """A lone bulk request starts on the next loop turns (the 20 ms gather was a one-shot
    Wyoming transcript's pure delay); while another request is admitted and has not
    handed over its windows (`reserve`), the engine gathers, and the two share a batch."""
    batcher, asr = idle_bulk
    now = time.monotonic()
    clip = to_float32(tone(300, 3.0))
    alone = asyncio.ensure_future(batcher.bulk(clip, "en", deadline=now + 2, expires=now + 30))
    for _ in range(3):  # the task's first step, then the flush: no timer in between
        await asyncio.sleep(0)
    assert batcher.bulk_batches == 1
    assert (await alone).text == "tone300"

    coming = batcher.reserve(1, 3.0, now + 2)  # admitted; its window not yet handed over
    first = asyncio.ensure_future(batcher.bulk(clip, "en", deadline=now + 2, expires=now + 30))
    for _ in range(3):
        await asyncio.sleep(0)
    assert batcher.bulk_batches == 1  # gathering for the admitted one
    second = batcher.bulk(clip, "en", deadline=now + 2, expires=now + 30, reservation=coming)
    results = await asyncio.gather(first, second)
    assert [r.text for r in results] == ["tone300", "tone300"]
    assert batcher.bulk_batches == 2 and asr.batches[-1] == [clip.size, clip.size]

    # An upload's own later windows (a VAD pass away) hold nothing back: not when its head
    # is handed over, nor once a gathering begun for another has nothing else to wait for.
    upload = batcher.reserve(3, 9.0, now + 2)
    head = asyncio.ensure_future(
        batcher.bulk(clip, "en", deadline=now + 2, expires=now + 30, reservation=upload)
    )
    for _ in range(3):
        await asyncio.sleep(0)
    assert batcher.bulk_batches == 3
    await head
    batcher.expect_bulk(1)  # a recording on its way: the next window gathers for it
    second = asyncio.ensure_future(
        batcher.bulk(clip, "en", deadline=now + 2, expires=now + 30, reservation=upload)
    )
    await asyncio.sleep(0.5 * BULK_GATHER_S)
    batcher.expect_bulk(-1)  # it went away; only the upload's own third window is to come
    await asyncio.sleep(2 * BULK_GATHER_S)  # past the next step, short of BULK_GATHER_MAX_S
    assert batcher.bulk_batches == 4
    await second
    batcher.release(upload)


async def test_a_one_shot_recording_on_its_way_is_waited_for_within_a_bound(
    idle_bulk: tuple[AsrBatcher, _BatchingAsr],
) -> None:
    """A recording still being sent (`expect_bulk`: a burst of one-shot Wyoming requests)
    holds an idle engine back, step by step, until it is handed over, so the two share a
    batch; a request that never comes holds it at most BULK_GATHER_MAX_S."""
    batcher, asr = idle_bulk
    now = time.monotonic()
    clip = to_float32(tone(300, 3.0))
    batcher.expect_bulk(1)
    first = asyncio.ensure_future(batcher.bulk(clip, "en", deadline=now + 2, expires=now + 30))
    await asyncio.sleep(2.5 * BULK_GATHER_S)  # past the first gathering step
    assert batcher.bulk_batches == 0 and batcher.bulk_on_the_way == 1
    batcher.expect_bulk(-1)  # here now
    second = batcher.bulk(clip, "en", deadline=now + 2, expires=now + 30)
    await asyncio.gather(first, second)
    assert batcher.bulk_batches == 1 and asr.batches[-1] == [clip.size, clip.size]

    batcher.expect_bulk(1)  # announced, never sent
    alone = asyncio.ensure_future(batcher.bulk(clip, "en", deadline=now + 2, expires=now + 30))
    await asyncio.sleep(BULK_GATHER_MAX_S + 0.05)  # a timer due after every gathering step
    assert batcher.bulk_batches == 2
    await alone

"""A session's parts without a server: the fast path and the awaiting feed are one way in
(the same counts, deduplication and acknowledgements), and a tts session refuses audio."""

from __future__ import annotations

import asyncio
import gc
import weakref

import numpy as np
import pytest

from tests.fakes import fake_runtime, tone
from voxserve.config import load_settings
from voxserve.errors import VoxError
from voxserve.events import StreamConfig
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.session import Session

SEQS = [0, 1, 1, 2, 5, 3, 3, 4, 6]  # a duplicate, a gap filled late (twice), a duplicate


def _session(mode: str = "asr", sample_rate: int = 16_000) -> Session:
    runtime = fake_runtime(load_settings(log_level="warning"))
    config = StreamConfig(mode=mode, sample_rate=sample_rate)
    return Session(runtime.session_context(), config, Outbox(64))


def _counts(session: Session) -> tuple[object, ...]:
    audio = session.audio
    assert audio is not None
    dedup = session.dedup
    return (
        session.received,
        dedup.duplicates,
        dedup.gaps,
        dedup.reordered,
        session.acked_seq,
        audio.ring.write_total,
    )


async def test_fast_path_and_feed_count_deduplicate_and_acknowledge_alike() -> None:
    pcm = memoryview(tone(440, 0.02).astype("<i2").tobytes())
    fed, taken = _session(), _session()
    for seq in SEQS:
        await fed.feed_audio(seq, pcm)
    assert taken.can_take_audio_now(len(pcm), ahead=len(pcm) * (len(SEQS) - 1))
    taken.take_audio_now([(seq, pcm) for seq in SEQS], 1000.0)
    assert _counts(fed) == _counts(taken) == (9, 2, 0, 2, 6, 7 * 320)
    fed.release()
    taken.release()


async def test_a_resampled_feed_writes_what_the_resampler_makes() -> None:
    session = _session(sample_rate=8_000)
    assert not session.can_take_audio_now(320)  # the fast path takes 16 kHz only
    pcm = memoryview(tone(440, 0.02, rate=8_000).astype("<i2").tobytes())
    for seq in range(10):
        await session.feed_audio(seq, pcm)
    audio = session.audio
    assert audio is not None and session.acked_seq == 9 and session.received == 10
    assert 0 < audio.ring.write_total <= 10 * 320
    assert np.abs(audio.ring.read()).max() > 1000  # the tone, not silence
    session.release()


async def test_a_tts_session_refuses_audio_and_counts_it() -> None:
    session = _session(mode="tts")
    assert not session.can_take_audio_now(640) and session.audio_wanted_in() == 0
    with pytest.raises(VoxError, match="take text, not audio"):
        await session.feed_audio(0, memoryview(bytes(640)))
    session.rejected += 1  # as a transport counts a frame it refused itself
    assert (session.received, session.rejected, session.acked_seq) == (0, 2, None)
    ended = session.ended_event()
    assert (ended.received, ended.rejected, ended.duplicates) == (0, 2, 0)
    session.release()


async def test_a_finished_listener_is_freed_without_a_gc_pass() -> None:
    """The listener's parts (pipeline/turns/listen_state.py) are handed the stream per call
    and never hold it: once an asr session has run and is dropped, its listener goes by
    reference counting, not at the next full GC pass (soaks with session churn grew RSS)."""
    session = _session()
    pcm = memoryview(tone(440, 0.02).astype("<i2").tobytes())
    silence = memoryview(bytes(640))

    async def drain(outbox: Outbox) -> None:
        while await outbox.next() is not None:
            pass

    drained = asyncio.create_task(drain(session.outbox))
    ran = asyncio.create_task(session.run())
    seq = 0
    for frame in [pcm] * 40 + [silence] * 60 + [pcm] * 40:  # a turn, and one cut at the end
        await session.feed_audio(seq, frame)
        seq += 1
    await session.end_input()
    await asyncio.wait_for(ran, 20)
    await drained
    assert session.ended_event().segments == 2  # partials, finals, pauses all ran
    listener = weakref.ref(session.listener) if session.listener else None
    gc.disable()
    try:
        del session, ran
        assert listener is not None and listener() is None
    finally:
        gc.enable()

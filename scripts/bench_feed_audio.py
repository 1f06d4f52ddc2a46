"""In-process cost of the receive path per 20 ms frame: parse the binary frame, dedup, copy
into the session's pooled ring, counters, the credit check, and the listener's batched ring
read (every 3 frames, as VAD batches of 1024 samples do). No sockets, no engines.

    .venv/bin/python -m scripts.bench_feed_audio     (from the repository root)
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from tests.fakes import fake_runtime
from voxserve.config import PipelineConfig, load_settings
from voxserve.events import StreamConfig
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.session import Session
from voxserve.server.session.stream_protocol import parse_audio_frame

FRAMES = 50_000


async def main() -> None:
    settings = load_settings()
    settings = settings.model_copy(
        update={"pipeline": PipelineConfig(ring_full_policy="drop_oldest")}
    )
    session = Session(
        fake_runtime(settings).session_context(), StreamConfig(mode="asr"), Outbox(256)
    )
    pcm = (np.random.default_rng(0).standard_normal(320) * 1000).astype("<i2").tobytes()
    messages = [i.to_bytes(4, "big") + pcm for i in range(FRAMES)]
    started = time.perf_counter()
    for i, message in enumerate(messages):
        seq, view = parse_audio_frame(message, 16_000, 200)
        await session.feed_audio(seq, view)
        if i % 3 == 2:
            session.audio.ring.read()
    took = time.perf_counter() - started
    print(f"parse + feed_audio + batched read: {took / FRAMES * 1e6:.2f} us per frame")


if __name__ == "__main__":
    asyncio.run(main())

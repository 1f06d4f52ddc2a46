"""pipecat's services run the way its own tests run them (pipecat.tests.utils.run_test): a
`Pipeline` in a `PipelineWorker` under a `WorkerRunner`, no transport; frames are queued in
and a `Collector` at the end keeps what comes out, so a test waits for the frame it needs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from pipecat.frames.frames import EndFrame, Frame, InputAudioRawFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner


class Collector(FrameProcessor):
    """Keeps every frame that reaches it, then passes it on."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []
        self._changed = asyncio.Condition()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append(frame)
        async with self._changed:
            self._changed.notify_all()
        await self.push_frame(frame, direction)

    async def until(self, done: Callable[[list[Frame]], bool], limit_s: float = 30.0) -> None:
        async with asyncio.timeout(limit_s), self._changed:
            await self._changed.wait_for(lambda: done(self.frames))

    def of(self, kind: type[Frame]) -> list[Frame]:
        return [f for f in self.frames if isinstance(f, kind)]


@asynccontextmanager
async def running(
    *processors: FrameProcessor, rate: int = 24_000
) -> AsyncIterator[tuple[PipelineWorker, Collector]]:
    """The processors as a started pipeline, with a Collector at the end unless one is among
    them (where the frames it needs pass: an aggregator keeps some); ended by an EndFrame."""
    sinks = [p for p in processors if isinstance(p, Collector)]
    sink = sinks[0] if sinks else Collector()
    params = PipelineParams(audio_in_sample_rate=rate, audio_out_sample_rate=rate)
    worker = PipelineWorker(
        Pipeline([*processors] if sinks else [*processors, sink]),
        cancel_on_idle_timeout=False,
        params=params,
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")  # type: ignore[misc]
    async def _started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(10):
            await started.wait()
        yield worker, sink
    finally:
        await worker.queue_frame(EndFrame())
        try:
            async with asyncio.timeout(10):
                await run
        except TimeoutError:
            await worker.cancel()
            await run


def audio_frames(pcm: bytes, rate: int, ms: int = 20) -> list[InputAudioRawFrame]:
    step = rate * 2 * ms // 1000
    return [
        InputAudioRawFrame(audio=pcm[i : i + step], sample_rate=rate, num_channels=1)
        for i in range(0, len(pcm), step)
    ]


async def speak(worker: PipelineWorker, pcm: bytes, rate: int, speed: float = 4.0) -> None:
    """`pcm` in 20 ms frames at `speed` times real time."""
    for frame in audio_frames(pcm, rate):
        await worker.queue_frame(frame)
        await asyncio.sleep(0.02 / speed)

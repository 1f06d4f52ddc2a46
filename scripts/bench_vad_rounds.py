"""What one VAD round costs, fixed and per stream: the price of a shorter gathering wait.

`pipeline.vad_batch_wait_ms` trades the frame-handling lag (a mark's echo waits for the
round that takes its audio) for CPU: each round pays a fixed cost (the batcher, the stage,
the metrics, the engine's own per-call overhead) however few streams it judges. This runs
rounds of K streams of two 32 ms windows each through the real `VadBatcher`, `EngineStage`
and `Metrics`, on the event loop as the server runs them, and prints the CPU time per round
(docs/benchmarks.md, "The bare-server ratio, the bench's phases spread").

    python scripts/bench_vad_rounds.py --engine load --streams 1,12
    python scripts/bench_vad_rounds.py --engine silero --streams 1,4,12 --rounds 1000
    python scripts/bench_vad_rounds.py --engine none --streams 1,12   # the server's part only
"""

from __future__ import annotations

import argparse
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from voxserve.config import PipelineConfig
from voxserve.engines.base import VadEngine
from voxserve.engines.load import LoadVad
from voxserve.observe.metrics import Metrics
from voxserve.pipeline.scheduling.stages import Stages
from voxserve.pipeline.scheduling.vad_batch import VadBatcher

WINDOWS = 2  # an asr session's batch: two 32 ms windows per wake-up


class _Job:
    """A stream with two windows of quiet noise due (VadJob)."""

    def __init__(self, vad: VadEngine, rng: np.random.Generator) -> None:
        self.state = vad.new_state()
        self.audio = (rng.random(512 * WINDOWS, dtype=np.float32) - 0.5) * 0.2

    def vad_input(self) -> tuple[Any, np.ndarray]:
        return self.state, self.audio

    def vad_result(self, probs: Any, error: BaseException | None) -> None:
        if error is not None:
            raise error


class _NoVad(LoadVad):
    """An engine that answers without looking: what is left is the server's own part."""

    def speech_probs_many(self, states: list[Any], audios: list[Any]) -> list[Any]:
        zeros = np.zeros(WINDOWS, np.float32)
        return [zeros] * len(states)


def _engine(name: str) -> VadEngine:
    if name == "silero":
        from voxserve.engines.silero_vad import SileroVad

        return SileroVad()
    return _NoVad() if name == "none" else LoadVad(hold_ms=128)


async def _per_round(vad: VadEngine, streams: int, rounds: int) -> float:
    """CPU seconds per round of `streams` streams (after 200 rounds of warm-up)."""
    metrics, cfg = Metrics(), PipelineConfig()
    stages = Stages(cfg, ThreadPoolExecutor(2), metrics.observe_stage)
    batcher = VadBatcher(vad, stages.stage("vad"), max_wait_ms=0, max_batch=cfg.vad_max_batch)
    batcher.on_batch = metrics.observe_batch
    rng = np.random.default_rng(0)
    jobs = [_Job(vad, rng) for _ in range(streams)]

    async def run(n: int) -> None:
        for _ in range(n):
            for job in jobs:
                batcher.enqueue(job)
            assert batcher._rounds is not None
            await batcher._rounds

    await run(200)
    began = time.process_time()
    await run(rounds)
    return (time.process_time() - began) / rounds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", choices=("load", "silero", "none"), default="load")
    p.add_argument("--streams", default="1,12", help="streams per round, comma-separated")
    p.add_argument("--rounds", type=int, default=5000)
    args = p.parse_args()
    vad = _engine(args.engine)
    for k in (int(s) for s in args.streams.split(",")):
        cost = asyncio.run(_per_round(vad, k, args.rounds))
        print(f"{args.engine}: {k} streams a round: {cost * 1e6:.1f} us a round")


if __name__ == "__main__":
    main()

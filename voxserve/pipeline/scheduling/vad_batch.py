"""Cross-session VAD batching: one executor call judges the audio of every stream that is due.

Handing work to a thread costs more than silero's ~120 µs per window (the bench measured a
2.8 ms mean stage latency for ~20 µs of work at 130 streams), and waking every stream's task
twice per batch of frames (to send its request, then for its answer) cost as much again
(py-spy: 22% of the server's CPU at 100 streams). So listeners do not call the engine: a due
listener is *enqueued* here (`VadJob`), and one *round* takes the audio of every due stream,
runs it as one batched engine call (window k of every stream as one model call where the
engine has `speech_probs_many`) and hands each stream its probabilities synchronously. A
stream's own task wakes only when the answer needs it (a turn event, a mark, end of input).
Per-stream order holds because a listener is enqueued at most once at a time.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from voxserve.audio.pcm import Float32Array
from voxserve.engines.base import VadEngine, inline_safe
from voxserve.pipeline.scheduling.batcher import Batcher
from voxserve.pipeline.scheduling.stage import EngineStage

VadRequest = tuple[Any, Float32Array]  # (the stream's VAD state, its whole windows of audio)


class VadJob(Protocol):
    """A stream with audio waiting for VAD (pipeline/turns/listener.py)."""

    def vad_input(self) -> VadRequest | None:
        """Take the stream's due audio; None when it holds no whole window."""

    def vad_result(self, probs: Float32Array | None, error: BaseException | None) -> None:
        """The answer for the audio `vad_input` took (probs None when it took none)."""


def judge_many(vad: VadEngine, states: Sequence[Any], audios: Sequence[Float32Array]) -> list[Any]:
    """Blocking: the engine's batched path if it has one, else one stream after another."""
    many = getattr(vad, "speech_probs_many", None)
    if callable(many):
        return list(many(states, audios))
    return [vad.speech_probs(state, audio) for state, audio in zip(states, audios, strict=True)]


class VadBatcher(Batcher[VadRequest, Float32Array]):
    def __init__(
        self, vad: VadEngine, stage: EngineStage, *, max_wait_ms: float, max_batch: int
    ) -> None:
        def run_many(items: list[VadRequest]) -> list[Float32Array]:
            results = judge_many(vad, [s for s, _ in items], [a for _, a in items])
            return [np.asarray(probs, dtype=np.float32) for probs in results]

        super().__init__(
            "vad",
            stage,
            run_many,
            max_wait_ms=max_wait_ms,
            max_batch=max_batch,
            inline_ok=inline_safe(vad),
        )
        self.vad = vad
        self._due: list[VadJob] = []
        self._rounds: asyncio.Task[None] | None = None
        self._due_held = 0  # what the due jobs add to stage.held while a round runs
        self._first_due_at = 0.0  # perf_counter when the earliest job now due was enqueued

    async def speech_probs(self, state: Any, audio: Float32Array) -> Float32Array:
        """One request on its own (a stream's last partial window at the end of input)."""
        return await self.submit((state, audio))

    def enqueue(self, job: VadJob) -> None:
        """Judge `job`'s audio in the next round; the caller enqueues a job once at a time."""
        if self._closed:
            job.vad_result(None, asyncio.CancelledError())
            return
        if not self._due:
            self._first_due_at = time.perf_counter()
        self._due.append(job)
        loop = asyncio.get_running_loop()
        self._note_arrival(loop.time())
        rounds = self._rounds
        if rounds is None or rounds.done() or rounds.get_loop() is not loop:
            self._rounds = loop.create_task(self._run_rounds(), name="voxserve-vad-rounds")
        else:
            self._report_due()

    async def _run_rounds(self) -> None:
        """Rounds until nobody is due. Streams that become due during a round (the engine
        call takes a thread hop) go together in the next one, as held requests do."""
        while self._due:
            # Company coming within max_wait (the arrival rate says so): gather it first, so
            # a round under load judges many streams, not the one or two due after the last
            # round's thread hop. Waits at most max_wait after the earliest due stream.
            if len(self._due) < self.max_batch and self._company_within(self.max_wait_s):
                left = self._first_due_at + self.max_wait_s - time.perf_counter()
                if left > 0:
                    await asyncio.sleep(left)
            due, self._due = self._due, []
            self._report_due()
            taken: list[tuple[VadJob, VadRequest]] = []
            for job in due:
                try:
                    request = job.vad_input()
                except Exception as exc:  # one stream's failure is its own
                    job.vad_result(None, exc)
                    continue
                if request is None:
                    job.vad_result(None, None)
                else:
                    taken.append((job, request))
            chunks = [taken[i : i + self.max_batch] for i in range(0, len(taken), self.max_batch)]
            if len(chunks) == 1:  # the usual round: no task for gather to make
                answers = [await self._judge_chunk(chunks[0])]
            else:
                answers = await asyncio.gather(*(self._judge_chunk(c) for c in chunks))
            for chunk, results in zip(chunks, answers, strict=True):
                for (job, _), result in zip(chunk, results, strict=True):
                    if isinstance(result, BaseException):
                        job.vad_result(None, result)
                    else:
                        job.vad_result(result, None)
        self._report_due()

    async def _judge_chunk(
        self, chunk: list[tuple[VadJob, VadRequest]]
    ) -> list[Float32Array | BaseException]:
        """One engine call for a chunk's requests (rounds carry no deadlines)."""
        unknown: list[float | None] = [None] * len(chunk)
        return await self._call([request for _, request in chunk], unknown, unknown)

    def _report_due(self) -> None:
        busy = self._rounds is not None and not self._rounds.done()
        held = math.ceil(len(self._due) / self.max_batch) if busy else 0
        self.stage.held += held - self._due_held
        self._due_held = held

    def close(self) -> None:
        super().close()
        if self._rounds is not None:
            self._rounds.cancel()
        due, self._due = self._due, []
        for job in due:
            job.vad_result(None, asyncio.CancelledError())
        self.stage.held -= self._due_held
        self._due_held = 0

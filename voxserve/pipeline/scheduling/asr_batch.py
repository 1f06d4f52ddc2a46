"""Cross-session batching of final transcriptions.

Whisper (CTranslate2) encodes and decodes several utterances that share an encoder window in
one call (`transcribe_many`), sharing the per-call overhead and the matrix products, with
results identical to one at a time. Finals of different sessions go through one `Batcher`
that runs as many batches at once as the engine runs calls in parallel (its
`parallel_calls`, CTranslate2's replicas; else the stage's limit): a final that ends while
Whisper is busy would wait anyway, so it waits here and joins the next batch. Measured: the
30 ms gathering wait alone made batches of ~1 (finals rarely end within 30 ms of each
other). Near saturation (Whisper busy >= `gather_when_busy` of the last ~2 s) an idle
Whisper also waits for company within the first final's deadline slack
(pipeline/scheduling/batcher.py): +4-12% finals per core at 32-40 streams with the gate at 0, for
~150 ms on the median final. Partials stay one at a time (best effort, skipped while finals wait).
An engine without `transcribe_many` is called once per utterance inside the batch.

Uploads' windows come here too, as bulk requests (`bulk`, pipeline/recognition/bulk.py): batches
of their own, run as bulk calls on the ASR stage, each holding at most
`asr.bulk_batch_s` of audio (pipeline/scheduling/batcher.py), so concurrent uploads and a long
recording's windows share engine batches while live finals keep their slot.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Hashable
from typing import Any, cast

import numpy as np

from voxserve.audio.pcm import Float32Array, Int16Array, to_float32
from voxserve.engines.base import AsrEngine, inline_safe
from voxserve.pipeline.scheduling.batcher import Batcher, BulkReservation
from voxserve.pipeline.scheduling.stage import EngineStage
from voxserve.types import SAMPLE_RATE, AsrOptions, AsrResult

# (16 kHz audio, language, options): a batch groups requests with equal language and options
AsrRequest = tuple[Float32Array | Int16Array, str | None, AsrOptions | None]
# An idle Whisper waits (within a final's deadline slack) when one more final is expected in
# that time: a pair costs ~104 ms of CPU per utterance against 134 alone (docs/benchmarks.md).
MIN_COMPANY = 1.0


def float_audio(audio: Float32Array | Int16Array) -> Float32Array:
    """A window as the engines read it: an upload is held as int16 (half the bytes) and
    each window becomes float32 here, in the engine's thread, never on the event loop."""
    if audio.dtype == np.int16:
        return to_float32(cast(Int16Array, audio))
    return cast(Float32Array, audio)


def takes_turn_hints(asr: AsrEngine) -> bool:
    """Whether the engine's `transcribe_many` can be told a batch needs no turn-end hints
    (`turn_hints`: Whisper's `stop_before_last_word`)."""
    many = getattr(asr, "transcribe_many", None)
    if not callable(many):
        return False
    try:
        return "turn_hints" in inspect.signature(many).parameters
    except (TypeError, ValueError):
        return False


def transcribe_many(
    asr: AsrEngine, items: list[AsrRequest], *, turn_hints: bool | None = None
) -> list[AsrResult]:
    """Blocking: one engine batch per (language, options), results back in request order.
    `options` reach the engine only when given: an engine written before them still
    serves requests that ask nothing of it; `turn_hints` (False: an upload's windows end
    no turn) likewise, and only to an engine that `takes_turn_hints`."""
    many = getattr(asr, "transcribe_many", None)
    results: list[AsrResult | None] = [None] * len(items)
    groups: dict[tuple[str | None, AsrOptions | None], list[int]] = defaultdict(list)
    for index, (_, language, options) in enumerate(items):
        groups[(language, options)].append(index)
    for (language, options), indexes in groups.items():
        audios = [float_audio(items[i][0]) for i in indexes]
        extra: dict[str, Any] = {"options": options} if options is not None else {}
        if callable(many):
            if turn_hints is not None:
                extra["turn_hints"] = turn_hints
            batch = list(many(audios, language=language, partial=False, **extra))
        else:
            batch = [asr.transcribe(audio, language=language, **extra) for audio in audios]
        for i, result in zip(indexes, batch, strict=True):
            results[i] = result
    return [result for result in results if result is not None]


class AsrBatcher(Batcher[AsrRequest, AsrResult]):
    def __init__(
        self,
        asr: AsrEngine,
        stage: EngineStage,
        *,
        max_wait_ms: float,
        max_batch: int,
        gather_when_busy: float = 0.0,
        bulk_batch_s: float | None = None,
        max_bulk_batch: int | None = None,
    ) -> None:
        def run_many(items: list[AsrRequest]) -> list[AsrResult]:
            return transcribe_many(asr, items)

        bulk_hints = False if takes_turn_hints(asr) else None

        def run_bulk(items: list[AsrRequest]) -> list[AsrResult]:
            return transcribe_many(asr, items, turn_hints=bulk_hints)

        parallel = getattr(asr, "parallel_calls", None)
        super().__init__(
            "asr",
            stage,
            run_many,
            run_bulk=run_bulk,
            max_wait_ms=max_wait_ms,
            max_batch=max_batch,
            max_inflight=parallel if isinstance(parallel, int) else None,
            min_company=MIN_COMPANY,
            gather_when_busy=gather_when_busy,
            inline_ok=inline_safe(asr),
        )
        window_for = getattr(asr, "window_for", None)

        def bulk_key(request: AsrRequest) -> Hashable:
            """What Whisper runs as one batch: windows with one encoder window, language
            and options."""
            audio, language, options = request
            window = window_for(audio.size / SAMPLE_RATE) if callable(window_for) else None
            return (window, language, options)

        self.bulk_key = bulk_key
        # Finals carry deadlines: flow control judges this stage by whether the held ones
        # can still start in time (Batcher.live_lateness), not by their count.
        stage.watch_live(self)
        if bulk_batch_s is not None:
            self.bulk_cost = bulk_batch_s
        if max_bulk_batch is not None:
            self.max_bulk_batch = max(1, max_bulk_batch)

    async def final(
        self, audio: Float32Array, language: str | None, *, deadline: float | None
    ) -> AsrResult:
        return await self.submit((audio, language, None), deadline=deadline)

    async def bulk(
        self,
        audio: Float32Array | Int16Array,
        language: str | None,
        options: AsrOptions | None = None,
        *,
        deadline: float,
        expires: float,
        reservation: BulkReservation | None = None,
    ) -> AsrResult:
        """An upload's window (16 kHz), batched with other bulk windows (module docstring);
        one of `reservation`'s (its upload's admission: Batcher.reserve)."""
        seconds = audio.size / SAMPLE_RATE
        return await self.submit_bulk(
            (audio, language, options),
            deadline=deadline,
            expires=expires,
            cost=seconds,
            reservation=reservation,
        )

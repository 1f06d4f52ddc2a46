"""The VAD engine over a whole upload, as bulk work on the VAD stage.

Silero carries a recurrent state from window to window, so one recording is one long chain
of model calls (~19k windows for 10 minutes). The recording is split into PIECE_S pieces,
each with its own fresh state, and window k of every piece runs as one batched model call
(the engine's `speech_probs_many`, as live streams' rounds do): a 10-minute upload costs
~940 batched calls instead of 19k single ones. A fresh state needs a few windows to settle,
which is harmless at a piece's start (regions are padded). Each stage call covers at most
STEP_WINDOWS windows of every piece, so bulk VAD holds a VAD slot briefly and queues again
between calls, as an upload's ASR windows do (pipeline/scheduling/stage.py: live rounds keep the
rest).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from voxserve.audio.pcm import Float32Array, Int16Array
from voxserve.engines.base import VadEngine
from voxserve.errors import ErrorCode, VoxError
from voxserve.pipeline.scheduling.asr_batch import float_audio
from voxserve.pipeline.scheduling.stage import PRIORITY_BULK, EngineStage
from voxserve.pipeline.scheduling.vad_batch import judge_many
from voxserve.types import SAMPLE_RATE

PIECE_S = 30.0
STEP_WINDOWS = 128  # ~4 s of every piece per stage call
MAX_PIECES = 32  # pieces judged together (16 min of audio): a stage call's float32 copy is
# at most 32 x 4 s (8 MB), not 4 s of every piece of an hour (216 pieces at 1.8 h)


async def speech_probs(
    vad: VadEngine, stage: EngineStage, audio: Float32Array | Int16Array, *, expires: float
) -> Float32Array:
    """One speech probability per VAD window of `audio` (the tail padded to a whole
    window), computed in bulk calls on `stage` (VAD's) before `expires` (time.monotonic()).
    Nothing over the whole recording is made on the event loop: each call's slices are
    cut, made float32 and the tail padded in the stage's thread (`_judge`)."""
    width = vad.window_samples
    count = -(-audio.size // width)
    per_piece = max(1, int(PIECE_S * SAMPLE_RATE) // width)
    pieces = [(first, min(first + per_piece, count)) for first in range(0, count, per_piece)]
    probs = np.zeros(count, dtype=np.float32)
    for group in range(0, len(pieces), MAX_PIECES):
        mine = pieces[group : group + MAX_PIECES]
        states = [vad.new_state() for _ in mine]
        for step in range(0, per_piece, STEP_WINDOWS):
            due = [
                (index, first + step, min(first + step + STEP_WINDOWS, last))
                for index, (first, last) in enumerate(mine)
                if first + step < last
            ]
            if not due:
                break
            left = expires - time.monotonic()
            if left <= 0:
                raise VoxError(ErrorCode.STAGE_TIMEOUT, "vad did not answer in time", stage="vad")
            answers = await stage.run(
                _judge,
                vad,
                [states[index] for index, _, _ in due],
                audio,
                [(a * width, b * width) for _, a, b in due],
                timeout_s=left,
                deadline=expires,
                priority=PRIORITY_BULK,
            )
            for (_, a, b), answer in zip(due, answers, strict=True):
                probs[a:b] = np.asarray(answer, dtype=np.float32)[: b - a]
    return probs


def _judge(
    vad: VadEngine,
    states: list[Any],
    audio: Float32Array | Int16Array,
    spans: list[tuple[int, int]],
) -> list[Any]:
    """Blocking (the stage's thread): the spans of `audio` as float32, the last one padded
    with silence to a whole window, judged in one batched call."""
    clips: list[Float32Array] = []
    for a, b in spans:
        clip = float_audio(audio[a:b])
        if b > audio.size:  # the recording's tail: padded to a whole window
            clip = np.pad(clip, (0, b - audio.size))
        clips.append(clip)
    return judge_many(vad, states, clips)

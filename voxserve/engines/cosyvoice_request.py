"""One CosyVoice inference request, as every transport of the cosyvoice engine sends it.

CosyVoice's runtimes (runtime/python/grpc's `cosyvoice.CosyVoice/Inference`, the FastAPI
runtime's /inference_* routes, the `inference_*` methods of the in-process model) all take
the same four kinds of request: `sft` (a built-in speaker, `spk_id`), `zero_shot` (a prompt
recording and its transcript), `cross_lingual` (a prompt recording only) and `instruct` (a
built-in speaker plus a style instruction). A voxserve voice maps to one kind
(engines/cosyvoice_voices.py); each transport turns this into its own wire form.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from voxserve.audio.wav import write_wav

RequestKind = Literal["sft", "zero_shot", "cross_lingual", "instruct"]
REQUEST_KINDS: tuple[RequestKind, ...] = ("sft", "zero_shot", "cross_lingual", "instruct")
PROMPT_RATE = 16_000  # CosyVoice reads prompt recordings at 16 kHz


@dataclass(frozen=True, slots=True)
class Prompt:
    """A zero-shot or cross-lingual voice's prompt: its recording (16 kHz mono int16 PCM,
    kept on disk as `wav_path`) and, for zero-shot, what is said in it."""

    pcm16k: bytes
    wav_path: Path
    text: str = ""

    def wav(self) -> bytes:
        """The recording as a WAV file, from memory: the one on disk may be replaced or
        deleted while a reply that began with this voice is still being spoken."""
        return write_wav(np.frombuffer(self.pcm16k, dtype="<i2"), PROMPT_RATE)


@dataclass(frozen=True, slots=True)
class CosyRequest:
    """What to say (`text`) and how: `spk_id` for sft and instruct, `prompt` for zero-shot
    and cross-lingual, `instruct_text` for instruct."""

    kind: RequestKind
    text: str
    spk_id: str = ""
    prompt: Prompt | None = None
    instruct_text: str = ""
    speed: float = 1.0


class CosyTransport(Protocol):
    """One way to reach CosyVoice: a stream of int16 PCM byte strings at the model's rate,
    each yielded as soon as it arrives. Raises CosyUnavailable, CosyFailed or ChunkLate
    (engines/chunk_deadline.py); closing the iterator cancels the call."""

    where: str  # for messages: the URL, or "in-process"
    speeds: bool  # whether `speed` reaches the model (the runtimes' wire forms have none)

    def stream(self, request: CosyRequest) -> Iterator[bytes]: ...

    def close(self) -> None: ...


class CosyUnavailable(Exception):
    """The runtime cannot be reached (down, refusing connections) before any audio."""


class CosyFailed(Exception):
    """The runtime failed the call: an error status, or the stream broke mid-way."""


class CosyBusy(Exception):
    """The runtime refused the call for load (gRPC RESOURCE_EXHAUSTED, HTTP 429/503)."""

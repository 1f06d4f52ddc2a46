"""The shared vocabulary: audio constants and the frozen values that cross module boundaries."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

SAMPLE_RATE = 16_000
"""Internal sample rate: every stream is converted to 16 kHz mono int16 on arrival."""
FRAME_MS = 20
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000  # 320
FRAME_BYTES = FRAME_SAMPLES * 2  # 640: 16-bit PCM
SUPPORTED_INPUT_RATES = (8_000, 16_000, 22_050, 24_000, 48_000)
SUPPORTED_OUTPUT_RATES = (8_000, 16_000, 22_050, 24_000, 48_000)
SEQ_HEADER_BYTES = 4
"""Every binary audio message starts with a 4-byte big-endian seq_id."""


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What an engine is, for `voxserve engines`, cache keys and /v1/voices."""

    kind: str  # "vad" | "asr" | "tts" | "responder"
    name: str  # registry name, e.g. "whisper"
    package: str  # distribution that provides the model/runtime
    version: str  # version of that distribution (cache keys change with it)
    license: str
    model: str = ""  # model id, e.g. "tiny.en" or "en_US-joe-medium"


@dataclass(frozen=True, slots=True)
class Voice:
    """A TTS voice as advertised to clients."""

    id: str
    engine: str
    language: str
    sample_rate: int
    description: str = ""
    aliases: tuple[str, ...] = ()  # other ids that select this voice (e.g. a full model name)


@dataclass(frozen=True, slots=True)
class Word:
    """One recognised word with its time (ms, as its segment's) and the model's confidence."""

    word: str  # as the model spells it, with its leading space (Whisper's convention)
    start_ms: int
    end_ms: int
    probability: float = 0.0


@dataclass(frozen=True, slots=True)
class Segment:
    """A recognised span of an utterance; times are ms from the start of the stream.

    The scores are the decoder's for the window that produced the segment (OpenAI's
    verbose_json fields); engines without them leave the defaults. `tokens` are the
    model's token ids for the segment, `words` only when word timestamps were asked for."""

    text: str
    start_ms: int
    end_ms: int
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0
    temperature: float = 0.0
    tokens: tuple[int, ...] = ()
    words: tuple[Word, ...] = ()

    def shifted(self, offset_ms: int) -> Segment:
        """The same segment moved `offset_ms` later, its words too (stitching windows)."""
        return replace(
            self,
            start_ms=self.start_ms + offset_ms,
            end_ms=self.end_ms + offset_ms,
            words=tuple(
                replace(w, start_ms=w.start_ms + offset_ms, end_ms=w.end_ms + offset_ms)
                for w in self.words
            ),
        )


AsrTask = Literal["transcribe", "translate"]


@dataclass(frozen=True, slots=True)
class AsrOptions:
    """What a caller may ask of one recognition beyond the audio (OpenAI's transcription
    fields). The defaults ask nothing: the engine's own decoding, as live streams use.

    `prompt`: text the model reads as preceding the audio (spellings, style).
    `temperature`: None = the engine's default decoding (with its own fallbacks); 0 = greedy
    (or beam); > 0 = sampling at that temperature.
    `word_timestamps`: also time each word (Segment.words).
    `task`: "translate" makes English text from speech in any language; only engines whose
    `tasks` (engines/base.py `asr_tasks`) include it accept it."""

    prompt: str | None = None
    temperature: float | None = None
    word_timestamps: bool = False
    task: AsrTask = "transcribe"


@dataclass(frozen=True, slots=True)
class AsrResult:
    """What an ASR engine returns for one audio buffer. Times are ms from the buffer start."""

    text: str
    segments: tuple[Segment, ...] = ()
    language: str = "en"
    # The decoder's probability of stopping where it wrote the last word instead, where the
    # engine knows it: a word guessed past the speech (turns/endpointing.py reads it).
    stop_before_last_word: float | None = None


@dataclass(frozen=True, slots=True)
class TtsRequest:
    text: str
    voice: str
    speed: float = 1.0


@dataclass(frozen=True, slots=True)
class SessionCounters:
    """Reported in `session.ended`: nothing accepted is silently dropped."""

    received: int = 0
    duplicates: int = 0
    processed: int = 0
    dropped: int = 0
    reordered: int = 0
    gaps: int = 0
    extra: dict[str, int] = field(default_factory=dict)

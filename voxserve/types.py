"""The shared vocabulary: audio constants and the frozen values that cross module boundaries."""

from __future__ import annotations

from dataclasses import dataclass, field

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
class Segment:
    """A recognised span of an utterance; times are ms from the start of the stream."""

    text: str
    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class AsrResult:
    """What an ASR engine returns for one audio buffer. Times are ms from the buffer start."""

    text: str
    segments: tuple[Segment, ...] = ()
    language: str = "en"


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

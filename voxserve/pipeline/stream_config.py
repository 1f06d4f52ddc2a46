"""What a client asked for when it opened a stream, whatever the transport."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["asr", "tts", "assistant"]
MODES: tuple[Mode, ...] = ("asr", "tts", "assistant")


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """What `session.start` asked for, validated (voice/language are checked against the
    loaded engines by the session)."""

    mode: Mode
    sample_rate: int = 16_000
    encoding: str = "pcm_s16le"
    language: str | None = None
    voice: str | None = None
    output_sample_rate: int | None = None
    speed: float = 1.0
    partials: bool | None = None
    chunk_ms: int | None = None  # how often a partial transcript is re-decoded
    trace_id: str = ""
    # The client can reconnect with `session.resume` (WebSocket): if it drops, the session
    # is kept limits.resume_window_s instead of ending (its accepted audio still finishes).
    resumable: bool = False

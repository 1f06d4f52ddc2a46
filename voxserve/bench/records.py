"""What a load process measures in one step (`Raw`), and how several are merged.

Samples are seconds, named by metric; counts and error codes are Counters. A Raw is what
crosses the process boundary (pickled), so it holds only plain values and arrays.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# Latency metrics, in the order reports list them, with what each one measures.
METRICS: dict[str, str] = {
    "mark_lag": "mark sent -> its echo (frame-handling lag)",
    "ttfp": "first speech frame sent -> first transcript.partial (Realtime: transcription delta)",
    "final": "last speech frame sent -> transcript.final (Realtime: transcription completed)",
    "final_minus_hangover": "final latency minus vad.hangover_ms",
    "vad_end": "last speech frame sent -> vad.end / speech_stopped (includes the hangover)",
    "turn": "last speech frame sent -> first reply audio (assistant; Realtime: first "
    "response.output_audio.delta)",
    "first_audio": "text sent -> first audio byte (tts)",
    "first_audio_hot": "first audio of the repeated (hot) sentences (HTTP)",
    "first_audio_cold": "first audio of sentences asked once (HTTP)",
    "chunk_gap": "time between consecutive audio chunks of one reply",
    "underrun": "playback starvation per reply (real-time player from the first chunk)",
    "request": "HTTP speech request sent -> last audio byte",
    "rtp_send_lag": "webrtc: a frame due -> its RTP packet leaving the caller (the send "
    "lateness is taken when the frame is handed to the encoder, as WS clients take it at the "
    "socket send)",
    "frame_lag": "webrtc: the server's outgoing frames, due -> handed to the encoder (from "
    "voxserve_webrtc_frame_lag_seconds; bucket upper bounds)",
    "connect": "connect -> session.started (Realtime: session.updated; WebRTC: session.updated "
    "after the SDP exchange, ICE, DTLS and the data channel)",
    "refusal": "connect -> refusal (error event of a session the server did not admit)",
}


@dataclass
class Raw:
    samples: dict[str, list[float]] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    transcripts: list[tuple[str, str]] = field(default_factory=list)  # (reference, hypothesis)
    lateness: array[float] = field(default_factory=lambda: array("d"))  # s behind schedule
    loop_lag: array[float] = field(default_factory=lambda: array("d"))  # event-loop oversleep
    procs: list[dict[str, Any]] = field(default_factory=list)  # one per load process
    failed_streams: int = 0

    def add(self, metric: str, seconds: float) -> None:
        self.samples.setdefault(metric, []).append(seconds)

    def merge(self, other: Raw) -> None:
        for metric, values in other.samples.items():
            self.samples.setdefault(metric, []).extend(values)
        self.counts.update(other.counts)
        self.errors.update(other.errors)
        self.transcripts.extend(other.transcripts)
        self.lateness.extend(other.lateness)
        self.loop_lag.extend(other.loop_lag)
        self.procs.extend(other.procs)
        self.failed_streams += other.failed_streams


def merged(parts: list[Raw]) -> Raw:
    total = Raw()
    for part in parts:
        total.merge(part)
    return total

"""The asr / assistant stream: 20 ms frames by the wall clock, a `mark` every ~0.5 s, and
the server's events turned into latencies measured from when the matching audio was sent.

Definitions (also in docs/benchmarks.md):
- mark lag: from sending a mark to receiving its echo; the server echoes it once all audio
  sent before it has been through VAD, so it is the frame-handling lag.
- ttfp: from sending the utterance's first speech frame to its first transcript.partial.
- final: from sending the utterance's last speech frame (speech ends there; the frame is
  sent at the moment it is complete, as a live microphone would) to its last
  transcript.final. The server's VAD hangover is part of it; `final_minus_hangover`
  subtracts the configured hangover.
- turn (assistant): from the same last speech frame to the first byte of the reply audio.
- premature turn (assistant): reply audio that began while its utterance was still being
  spoken (the speaker had only paused: the fixtures of tests/fixtures/turns pause 300-700 ms
  mid-sentence); premature_turn_rate = such utterances / utterances.
Server segments are matched to utterances by their start_ms (see program.Script). After
the run's end the stream sends silence for the hangover + 0.3 s before audio.end, so its
last turn ends as it would live; speech cut off by the end is not counted.
"""

from __future__ import annotations

import json
import math
import time
from array import array
from typing import Any

from websockets.asyncio.client import ClientConnection

from voxserve.bench.program import Script, frame_bytes, pcm_at
from voxserve.bench.records import Raw
from voxserve.bench.replies import ReplyAudio, reply_began
from voxserve.bench.schedule import FRAME_S, FrameClock, mark_due
from voxserve.bench.wsbase import WsStream, paced
from voxserve.types import SAMPLE_RATE

TAIL_S = 0.3  # silence after the hangover before audio.end


class AudioStream(WsStream):
    def __init__(
        self,
        url: str,
        start: dict[str, Any],
        raw: Raw,
        *,
        script: Script,
        end_at: float,
        drain_s: float,
        mark_every_s: float = 0.5,
        mark_phase: int = 0,
        hangover_s: float = 0.5,
        lateness: array[float] | None = None,
        deflate: bool = False,
        rate: int = SAMPLE_RATE,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            url, start, raw, end_at=end_at, drain_s=drain_s, deflate=deflate, headers=headers
        )
        self.script = script
        self.rate = rate  # the frames' sample rate (session.start sample_rate)
        self.mark_every = round(mark_every_s / FRAME_S)
        self.mark_phase = mark_phase
        self.hangover_s = hangover_s
        self.lateness = lateness if lateness is not None else array("d")
        self.marks: dict[int, float] = {}
        self.first_sent: dict[int, float] = {}
        self.last_sent: dict[int, float] = {}
        self.segments: dict[int, int | None] = {}  # server segment -> utterance number
        self.partial_seen: set[int] = set()
        self.finals: dict[int, list[tuple[int, float, str]]] = {}  # utt -> (end_ms, t, text)
        self.replies = ReplyAudio(raw, self._first_reply_audio)
        self.premature: set[int] = set()

    async def produce(self, ws: ClientConnection) -> None:
        """The script until end_at, then silence for the hangover (+ TAIL_S) so the last
        turn ends as it would live, not cut short by audio.end."""
        clock = FrameClock(time.monotonic())
        frames = self.script.whole(clock.frames_before(self.end_at))
        tail = math.ceil((self.hangover_s + TAIL_S) / FRAME_S)
        size = frame_bytes(self.rate)
        pcm, silent = pcm_at(self.script.program, self.rate), bytes(size)
        for k in range(frames + tail):
            now = await paced(clock, k, self.lateness)
            header = (k & 0xFFFFFFFF).to_bytes(4, "big")
            if k >= frames:
                await ws.send(header + silent)
                continue
            p = self.script.position(k)
            await ws.send(header + pcm[p * size : (p + 1) * size])
            if (u := self.script.speech_first(k)) is not None:
                self.first_sent[u] = now
            if (u := self.script.speech_last(k)) is not None:
                self.last_sent[u] = now
            if mark_due(k, self.mark_every, self.mark_phase):
                self.marks[k] = time.monotonic()
                await ws.send(json.dumps({"type": "mark", "id": k}))
        self.raw.counts["frames_sent"] += frames + tail

    def on_audio(self, size: int, now: float) -> None:
        self.replies.chunk(size, now)

    def on_event(self, kind: object, event: dict[str, Any], now: float) -> None:
        if kind == "mark":
            sent = self.marks.pop(event.get("id"), None)  # type: ignore[arg-type]
            if sent is not None:
                self.raw.add("mark_lag", now - sent)
                self.raw.counts["marks"] += 1
        elif kind == "vad.start":
            self.segments[int(event["segment"])] = self.script.utterance_at(int(event["start_ms"]))
            self.raw.counts["segments"] += 1
        elif kind == "vad.end":
            u = self.segments.get(int(event["segment"]))
            if u is not None and u in self.last_sent:
                self.raw.add("vad_end", now - self.last_sent[u])
        elif kind == "transcript.partial":
            self.raw.counts["partials"] += 1
            u = self.segments.get(int(event["segment"]))
            if u is not None and u not in self.partial_seen and u in self.first_sent:
                self.partial_seen.add(u)
                self.raw.add("ttfp", now - self.first_sent[u])
        elif kind == "transcript.final":
            self.raw.counts["finals"] += 1
            u = self.segments.get(int(event["segment"]))
            if u is None:
                self.raw.counts["finals_unmatched"] += 1
            else:
                entry = (int(event.get("end_ms", 0)), now, str(event.get("text", "")))
                self.finals.setdefault(u, []).append(entry)
        elif kind == "tts.start":
            self.replies.start(event)
        elif kind == "tts.end":
            self.replies.end(event)
        elif kind == "barge_in":
            self.raw.counts["barge_ins"] += 1

    def _first_reply_audio(self, reply: int, now: float) -> None:
        u = self.segments.get(reply)
        reply_began(self.raw, u, now, self.first_sent, self.last_sent, self.premature)

    def finish(self) -> None:
        """Per utterance whose end was sent: final latency from its last final, and the
        transcript (all its finals, in order) for WER; no final is an empty hypothesis."""
        self.raw.counts["marks_unanswered"] += len(self.marks)
        for u, sent in self.last_sent.items():
            self.raw.counts["utterances"] += 1
            finals = self.finals.get(u, [])
            if finals:
                received = max(t for _, t, _ in finals)
                self.raw.add("final", received - sent)
                self.raw.add("final_minus_hangover", received - sent - self.hangover_s)
            else:
                self.raw.counts["utterances_without_final"] += 1
            text = " ".join(t for _, _, t in sorted(finals, key=lambda f: f[1]) if t)
            self.raw.transcripts.append((self.script.reference(u), text))

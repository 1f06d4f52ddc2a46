"""The speaking half of a session: sentences -> TTS -> audio chunks, one reply at a time.

Every reply is framed by `tts.start` and `tts.end`; a cancelled reply (barge-in, `cancel`)
still gets its `tts.end` with `interrupted: true`, and its pending synthesis is withdrawn.
`playback_until` estimates when the client will have played what was sent (real-time clock),
so speech that starts while the reply is still audible counts as barge-in.

While TTS is degraded, a sentence that is not cached is not synthesised: the reply speaks
the fallback phrase instead (after a `tts.fallback` event) and ends; the rest of its text is
read and dropped, so the responder still finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from voxserve.audio.pcm import Int16Array
from voxserve.observe.tracing import TurnMarks
from voxserve.pipeline.chunking import Chunker, chunk_sizes
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.synthesis import synthesize
from voxserve.pipeline.tts_health import TtsDegraded
from voxserve.runtime import Runtime


@dataclass
class ReplyStats:
    reply: int
    chunks: int = 0
    samples: int = 0
    first_audio_s: float | None = None  # seconds from the reply's start to its first chunk
    interrupted: bool = False
    fallback: bool = False  # the fallback phrase was spoken (TTS degraded)


class Speaker:
    def __init__(
        self,
        runtime: Runtime,
        outbox: Outbox,
        *,
        voice: str,
        speed: float,
        sample_rate: int,
    ) -> None:
        self.runtime = runtime
        self.outbox = outbox
        self.voice = voice
        self.speed = speed
        self.sample_rate = sample_rate
        self.playback_until = 0.0
        self.replies = 0
        self.interrupted = 0

    def audible(self) -> bool:
        return time.monotonic() < self.playback_until

    def played_ms(self, stats: ReplyStats, started: float) -> int:
        """Audio the client has played by now, assuming it plays as it receives."""
        sent_ms = stats.samples * 1000 // self.sample_rate
        return min(sent_ms, int((time.monotonic() - started) * 1000))

    async def play(
        self,
        sentences: AsyncIterator[str],
        reply: int,
        *,
        since: float | None = None,
        turn: TurnMarks | None = None,
    ) -> ReplyStats:
        """Speak `sentences` as reply `reply`. `since` (perf_counter: the user's vad.end)
        makes the first chunk observe the assistant turn latency; `turn` gets tts marks."""
        stats = ReplyStats(reply)
        began = time.monotonic()
        started: float | None = None
        last_chunk = 0.0
        metrics = self.runtime.metrics
        self.replies += 1

        async def send(chunk: Int16Array) -> None:
            nonlocal started, last_chunk
            now = time.perf_counter()
            if started is None:
                if since is not None:
                    metrics.observe_turn(now - since)
                started = time.monotonic()
                stats.first_audio_s = started - began
                self.playback_until = started
                await self.outbox.event(
                    {
                        "type": "tts.start",
                        "reply": reply,
                        "voice": self.voice,
                        "sample_rate": self.sample_rate,
                        "encoding": "pcm_s16le",
                    }
                )
            else:
                metrics.observe_chunk_gap(now - last_chunk)
            last_chunk = now
            await self.outbox.audio(chunk.tobytes())
            stats.chunks += 1
            stats.samples += chunk.size
            self.playback_until = max(time.monotonic(), self.playback_until) + (
                chunk.size / self.sample_rate
            )

        try:
            async for sentence in sentences:
                if turn is not None and "tts.start" not in turn.marks:
                    turn.mark("tts.start")
                try:
                    chunks = synthesize(
                        self.runtime,
                        sentence,
                        voice=self.voice,
                        speed=self.speed,
                        sample_rate=self.sample_rate,
                    )
                    async with contextlib.aclosing(chunks):
                        async for chunk in chunks:
                            await send(chunk)
                except TtsDegraded as exc:
                    fallback = self._fallback_audio()
                    if fallback is None:
                        raise
                    await self._announce_fallback(reply, exc.reason)
                    stats.fallback = True
                    # Cut like any other reply (small first chunk, then growing).
                    sizes = chunk_sizes(self.runtime.settings.tts, self.sample_rate)
                    for piece in Chunker(*sizes).split(fallback):
                        await send(piece)
                    break
        except asyncio.CancelledError:
            stats.interrupted = True
            self.interrupted += 1
            self.playback_until = 0.0
            if started is not None:
                self.outbox.event_nowait(self._end_event(stats, started))
            raise
        except Exception:
            # An engine error mid-reply: close the reply's framing, the caller reports why.
            stats.interrupted = True
            if started is not None:
                await self.outbox.event(self._end_event(stats, started))
            raise
        if started is not None:
            await self.outbox.event(self._end_event(stats, started))
        if turn is not None:
            turn.mark("tts.end")
        if stats.fallback:
            async for _ in sentences:  # unspoken: let the text's producer finish
                pass
        return stats

    def _fallback_audio(self) -> Int16Array | None:
        return self.runtime.fallback.audio(self.voice, self.sample_rate)

    async def _announce_fallback(self, reply: int, reason: str) -> None:
        self.runtime.tts_health.fallbacks += 1
        await self.outbox.event(
            {
                "type": "tts.fallback",
                "reply": reply,
                "reason": reason,
                "text": self.runtime.fallback.text,
            }
        )

    def _end_event(self, stats: ReplyStats, started: float) -> dict[str, object]:
        event: dict[str, object] = {
            "type": "tts.end",
            "reply": stats.reply,
            "chunks": stats.chunks,
            "audio_ms": stats.samples * 1000 // self.sample_rate,
            "interrupted": stats.interrupted,
        }
        if stats.interrupted:
            event["played_ms"] = self.played_ms(stats, started)
        return event

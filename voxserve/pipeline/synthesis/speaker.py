"""The speaking half of a session: sentences -> TTS -> audio chunks, one reply at a time.

Every reply is framed by `tts.start` and `tts.end`; a cancelled reply (barge-in, `cancel`)
still gets its `tts.end` with `interrupted: true`, and its pending synthesis is withdrawn.
`playback_until` estimates when the client will have played what was sent (real-time clock),
so speech that starts while the reply is still audible counts as barge-in.

Output flow control: synthesis runs ahead of the sending by at most `tts.max_ahead_ms`
(ahead.py), and audio is sent at most `tts.pacing_lead_ms` ahead of the client's playback,
so a reply never piles up in buffers and a barge-in stops what the user hears quickly. A
client may also pace the audio itself with `credit` messages (`audio_ms` granted). A chunk
sent after the client's playback ran dry is an underrun (counted in `tts.end`).

While TTS is degraded, a sentence that is not cached is not synthesised: the reply speaks
the fallback phrase instead (after a `tts.fallback` event) and ends; the rest of its text is
read and dropped, so the responder still finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from voxserve.audio.pcm import Int16Array
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import UNSET, Event, TtsEnd, TtsFallback, TtsStart
from voxserve.observe.tracing import TurnMarks
from voxserve.pipeline.context import SpeechContext
from voxserve.pipeline.outbox import Outbox
from voxserve.pipeline.scheduling.tts_health import TtsDegraded
from voxserve.pipeline.synthesis.ahead import AudioAhead
from voxserve.pipeline.synthesis.chunking import Chunker, chunk_sizes
from voxserve.pipeline.synthesis.synthesize import synthesize
from voxserve.speakable import says_something


@dataclass
class ReplyStats:
    reply: int
    chunks: int = 0
    samples: int = 0
    first_audio_s: float | None = None  # seconds from the reply's start to its first chunk
    interrupted: bool = False
    fallback: bool = False  # the fallback phrase was spoken (TTS degraded)
    underruns: int = 0  # chunks sent after the client's playback had run dry
    # (samples of the reply's audio made by the end of it, sentence) per sentence spoken:
    # which text the first n samples say (spoken_text), e.g. for a barge-in's truncation
    sentences: list[tuple[int, str]] = field(default_factory=list)


def spoken_text(sentences: list[tuple[int, str]], samples: int) -> str:
    """The text said by the first `samples` of a reply's audio: the sentences whose audio
    ends by then and, of the sentence cut, its words in proportion to its audio sent (an
    estimate: words are not timed)."""
    said: list[str] = []
    start = 0
    for end, sentence in sentences:
        if end <= samples:
            said.append(sentence.strip())
            start = end
            continue
        if samples > start:
            words = sentence.split()
            said.append(" ".join(words[: len(words) * (samples - start) // (end - start)]))
        break
    return " ".join(part for part in said if part)


class Speaker:
    def __init__(
        self,
        ctx: SpeechContext,
        outbox: Outbox,
        *,
        voice: str,
        speed: float,
        sample_rate: int,
        cache_scope: str = "",
    ) -> None:
        self.ctx = ctx
        self.cache_scope = cache_scope
        self.outbox = outbox
        self.speed = speed
        self.configure(voice=voice, sample_rate=sample_rate)
        self.playback_until = 0.0
        self.replies = 0
        self.interrupted = 0
        self._credit_ms: float | None = None  # None until the client grants output credit
        self._granted = asyncio.Event()

    def configure(self, *, voice: str, sample_rate: int) -> None:
        """Speak the next reply with this voice at this rate (conversation sessions: a
        response's voice, a `session.update`); never called while a reply plays."""
        self.voice = voice
        self.sample_rate = sample_rate
        self.max_ahead_samples = self.ctx.settings.tts.max_ahead_ms * sample_rate // 1000

    def audible(self) -> bool:
        return time.monotonic() < self.playback_until

    def played_ms(self, stats: ReplyStats, started: float) -> int:
        """Audio the client has played by now, assuming it plays as it receives."""
        sent_ms = stats.samples * 1000 // self.sample_rate
        return min(sent_ms, int((time.monotonic() - started) * 1000))

    def grant(self, audio_ms: int) -> None:
        """The client's output credit (`credit` message with `audio_ms`): from the first
        grant on, reply audio is sent only against credit, on top of the real-time pacing."""
        self._credit_ms = (self._credit_ms or 0.0) + audio_ms
        self._granted.set()

    async def play(
        self,
        sentences: AsyncIterator[str],
        reply: int,
        *,
        since: float | Callable[[], float | None] | None = None,
        turn: TurnMarks | None = None,
        stats: ReplyStats | None = None,
        hold: asyncio.Event | None = None,
    ) -> ReplyStats:
        """Speak `sentences` as reply `reply`. `since` (perf_counter: the user's vad.end)
        makes the first chunk observe the assistant turn latency; `turn` gets tts marks.

        Synthesis runs in its own task up to `tts.max_ahead_ms` ahead of the sending, so
        the next sentence is ready when the previous one has played; the sending is paced
        to the client's playback (`tts.pacing_lead_ms` ahead of it). `stats`: the caller's,
        to read even when the reply is cancelled. `hold`: a speculative reply, synthesised
        ahead but sent (events too) only once it is set; `since` is then read at the first
        chunk. Withdrawn before that, it has sent nothing and counts as no reply."""
        stats = stats or ReplyStats(reply)
        began = time.monotonic()
        started: float | None = None
        last_chunk = 0.0
        metrics = self.ctx.metrics
        counted = False

        def confirmed() -> bool:
            """Counts the reply once it is one: at once, or once its `hold` is set (a
            speculative reply withdrawn before that counts as no reply)."""
            nonlocal counted
            if not counted and (hold is None or hold.is_set()):
                counted = True
                self.replies += 1
            return counted

        confirmed()

        async def send(chunk: Int16Array) -> None:
            nonlocal started, last_chunk
            now = time.perf_counter()
            if started is None:
                ended = since() if callable(since) else since
                if ended is not None:
                    metrics.observe_turn(now - ended)
                started = time.monotonic()
                stats.first_audio_s = started - began
                self.playback_until = started
                await self.outbox.event(
                    TtsStart(reply=reply, voice=self.voice, sample_rate=self.sample_rate)
                )
            else:
                metrics.observe_chunk_gap(now - last_chunk)
                if time.monotonic() > self.playback_until:  # the client ran dry
                    stats.underruns += 1
                    metrics.underruns.inc()
            last_chunk = now
            await self.outbox.audio(chunk.tobytes())
            stats.chunks += 1
            stats.samples += chunk.size
            self.playback_until = max(time.monotonic(), self.playback_until) + (
                chunk.size / self.sample_rate
            )

        ahead = AudioAhead(self.max_ahead_samples)
        producer = asyncio.create_task(
            self._produce(sentences, reply, stats, ahead, turn), name="voxserve-tts-ahead"
        )
        try:
            while (item := await ahead.get()) is not None:
                if not confirmed():
                    assert hold is not None  # a reply without one is confirmed at once
                    await hold.wait()
                    confirmed()
                if isinstance(item, Event):
                    await self.outbox.event(item)
                    continue
                if started is not None:
                    await self._pace(item.size)
                await send(item)
        except asyncio.CancelledError:
            stats.interrupted = True
            if confirmed():
                self.interrupted += 1
            self.playback_until = 0.0
            if started is not None:
                self.outbox.event_nowait(self._end_event(stats, started))
            raise
        except Exception:
            # An engine error mid-reply: close the reply's framing, the caller reports why.
            stats.interrupted = True
            if started is not None and not self.outbox.stalled:
                await self.outbox.event(self._end_event(stats, started))
            raise
        finally:
            if not producer.done():
                producer.cancel()
            await asyncio.wait([producer])
        confirmed()  # confirmed with nothing (left) to say
        if started is not None:
            await self.outbox.event(self._end_event(stats, started))
        if turn is not None:
            turn.mark("tts.end")
        if stats.fallback:
            async for _ in sentences:  # unspoken: let the text's producer finish
                pass
        return stats

    async def _produce(
        self,
        sentences: AsyncIterator[str],
        reply: int,
        stats: ReplyStats,
        ahead: AudioAhead,
        turn: TurnMarks | None,
    ) -> None:
        """Synthesise the reply's sentences into `ahead`; a failure is handed to the
        sending side (raised there after the audio already made)."""
        made = 0  # samples of audio made for the reply so far
        try:
            async for sentence in sentences:
                if not says_something(sentence):
                    continue  # "..." between sentences: nothing to synthesise
                if turn is not None and "tts.start" not in turn.marks:
                    turn.mark("tts.start")
                try:
                    chunks = synthesize(
                        self.ctx,
                        sentence,
                        voice=self.voice,
                        speed=self.speed,
                        sample_rate=self.sample_rate,
                        scope=self.cache_scope,
                    )
                    async with contextlib.aclosing(chunks):
                        async for chunk in chunks:
                            await ahead.put(chunk)
                            made += chunk.size
                    stats.sentences.append((made, sentence))
                except TtsDegraded as exc:
                    fallback = self._fallback_audio()
                    if fallback is None:
                        raise
                    self.ctx.speech.health.fallbacks += 1
                    await ahead.put(self._fallback_event(reply, exc.reason))
                    stats.fallback = True
                    # Cut like any other reply (small first chunk, then growing).
                    sizes = chunk_sizes(self.ctx.settings.tts, self.sample_rate)
                    for piece in Chunker(*sizes).split(fallback):
                        await ahead.put(piece)
                    break
        except Exception as exc:
            ahead.finish(exc)
            return
        ahead.finish()

    async def _pace(self, samples: int) -> None:
        """Wait until sending `samples` more keeps the client at most the pacing lead
        ahead of its playback, and (once the client grants credit) until it has credit."""
        lead = self.ctx.settings.tts.pacing_lead_ms / 1000
        wait = self.playback_until - time.monotonic() - lead
        if wait > 0:
            await asyncio.sleep(wait)
        if self._credit_ms is None:
            return
        stall_s = self.ctx.settings.limits.stalled_client_s
        while self._credit_ms <= 0:
            self._granted.clear()
            try:
                async with asyncio.timeout(stall_s):
                    await self._granted.wait()
            except TimeoutError:
                raise VoxError(
                    ErrorCode.CLIENT_STALLED,
                    f"no output credit from the client for {stall_s:g} s",
                    fatal=True,
                ) from None
        self._credit_ms -= samples * 1000 / self.sample_rate

    def _fallback_audio(self) -> Int16Array | None:
        return self.ctx.speech.fallback.audio(self.voice, self.sample_rate)

    def _fallback_event(self, reply: int, reason: str) -> TtsFallback:
        text = self.ctx.speech.fallback.text
        assert text is not None  # the phrase's audio, which the reply speaks, needs its text
        return TtsFallback(reply=reply, reason=reason, text=text)

    def _end_event(self, stats: ReplyStats, started: float) -> TtsEnd:
        return TtsEnd(
            reply=stats.reply,
            chunks=stats.chunks,
            audio_ms=stats.samples * 1000 // self.sample_rate,
            interrupted=stats.interrupted,
            underruns=stats.underruns,
            played_ms=self.played_ms(stats, started) if stats.interrupted else UNSET,
        )

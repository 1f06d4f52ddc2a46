"""Turn detection from VAD probabilities: when speech starts and ends, in stream samples.

Pure and clock-free (positions are sample counts), so it is tested by feeding numbers. Speech
is confirmed only after `min_speech_ms`, so a cough does not barge in on the assistant; the
start is then back-dated to where the speech really began.

A conversation session (the Realtime API) has its own settings (`TurnDetection`, made into a
VadConfig by `session_vad`), which may change while it runs (`TurnDetector.tune`), and its
client may end a turn (`cut`) or drop it (`drop`).

A tentative end: after `speculate_ms` of silence the detector says `SpeechPause` (once per
pause) and `SpeechResume` if speech comes back before the turn ended. With `semantic` on,
the silence that ends the turn is not fixed: it is the longest one until the listener has
judged the transcript at the pause and `settle`s it (pipeline/turns/endpointing.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from voxserve.config import VadConfig
from voxserve.events import TurnDetection
from voxserve.types import SAMPLE_RATE


@dataclass(frozen=True, slots=True)
class SpeechStart:
    start: int  # sample position where speech began


@dataclass(frozen=True, slots=True)
class SpeechEnd:
    start: int
    end: int  # sample position where speech stopped (hangover not included)
    forced: bool = False  # cut at max_utterance_s or at end of input


@dataclass(frozen=True, slots=True)
class SpeechPause:
    """A tentative end: speech stopped at `end` and has been silent speculate_ms."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class SpeechResume:
    """Speech came back after a SpeechPause: the turn goes on."""

    start: int


TurnEvent = SpeechStart | SpeechEnd | SpeechPause | SpeechResume

_CANDIDATE_GAP_MS = 96  # a pause this long before confirmation means it was not speech


def _samples(ms: float) -> int:
    return int(ms * SAMPLE_RATE / 1000)


def session_vad(server: VadConfig, detection: TurnDetection | None) -> VadConfig:
    """The server's VAD settings with a conversation session's own (None: the server's).
    A threshold of its own brings neg_threshold (where speech counts as ended) along: the
    server's gap below it, but never under half of it, so a low threshold still has a
    silence level that probabilities reach."""
    if detection is None:
        return server
    update: dict[str, float | int] = {}
    if detection.threshold is not None:
        gap = max(server.threshold - server.neg_threshold, 0.0)
        update["threshold"] = detection.threshold
        update["neg_threshold"] = max(detection.threshold - gap, detection.threshold / 2)
    if detection.prefix_padding_ms is not None:
        update["pad_ms"] = detection.prefix_padding_ms
    if detection.silence_duration_ms is not None and detection.type == "server_vad":
        update["hangover_ms"] = detection.silence_duration_ms
    return server.model_copy(update=update) if update else server


class TurnDetector:
    def __init__(self, cfg: VadConfig, window_samples: int, hangover_ms: int | None = None) -> None:
        self.window = window_samples
        self.speculate = 0  # samples of silence before a SpeechPause; 0: none (the listener's)
        self.semantic_hangover: int | None = None  # semantic: the longest wait (no text)
        self._turn_hangover: int | None = None  # semantic: this pause's, once judged
        self._paused = False  # a SpeechPause was said for the silence in progress
        self.tune(cfg, hangover_ms)
        self.candidate_gap = _samples(_CANDIDATE_GAP_MS)
        self.position = 0  # samples judged so far
        self._candidate: int | None = None
        self._start: int | None = None  # confirmed speech start
        self._silence_from: int | None = None

    @property
    def speaking(self) -> bool:
        return self._start is not None

    @property
    def trailing_silence(self) -> bool:
        """Speaking, but the last windows were silence (the hangover is running)."""
        return self._start is not None and self._silence_from is not None

    @property
    def speech_start(self) -> int | None:
        return self._start

    @property
    def candidate_start(self) -> int | None:
        """Where possible speech began, not yet confirmed as speech (min_speech_ms)."""
        return self._candidate

    def tune(self, cfg: VadConfig, hangover_ms: int | None = None) -> None:
        """New settings, from the next window judged on (the turn in progress goes on)."""
        self.threshold = cfg.threshold
        self.neg_threshold = cfg.neg_threshold
        self.min_speech = _samples(cfg.min_speech_ms)
        self.hangover = _samples(cfg.hangover_ms if hangover_ms is None else hangover_ms)
        self.max_utterance = _samples(cfg.max_utterance_s * 1000)

    @property
    def silence_from(self) -> int | None:
        """Where the silence in progress began (speaking only)."""
        return self._silence_from if self._start is not None else None

    def semantic(self, longest_ms: int | None) -> None:
        """Semantic end of turn on (the wait before the text is judged) or off (None)."""
        self.semantic_hangover = None if longest_ms is None else _samples(longest_ms)

    def settle(self, silence_from: int, wait_ms: int) -> SpeechEnd | None:
        """The transcript at the pause from `silence_from` was judged: this pause ends the
        turn after `wait_ms` of silence; the SpeechEnd now if it has lasted that long.
        Nothing if speech resumed since (another silence, or none)."""
        if self._start is None or self._silence_from != silence_from:
            return None
        self._turn_hangover = _samples(wait_ms)
        if self.position - silence_from < self._turn_hangover:
            return None
        event = SpeechEnd(self._start, silence_from)
        self._end_turn()
        return event

    def _hangover(self) -> int:
        if self.semantic_hangover is None:
            return self.hangover
        return self.semantic_hangover if self._turn_hangover is None else self._turn_hangover

    def _end_turn(self) -> None:
        self._start = self._silence_from = self._turn_hangover = None
        self._paused = False

    def cut(self) -> SpeechEnd | None:
        """The client ends the turn in progress now (as if its silence had lasted the
        hangover); None when no speech is in progress (a candidate is kept)."""
        if self._start is None:
            return None
        end = self._silence_from if self._silence_from is not None else self.position
        event = SpeechEnd(self._start, end, forced=True)
        self._end_turn()
        return event

    def drop(self) -> None:
        """Forget the turn in progress (and any candidate): nothing ends, nothing is sent."""
        self._end_turn()
        self._candidate = None

    def restart_at(self, position: int) -> None:
        """Judge again from `position` (turn detection switched back on), with no turn."""
        self.drop()
        self.position = position

    def feed(self, probs: list[float]) -> list[TurnEvent]:
        events: list[TurnEvent] = []
        for p in probs:
            begin = self.position
            self.position += self.window
            if self._start is None:
                self._idle_window(p, begin, events)
            else:
                self._speech_window(p, begin, events)
        return events

    def _idle_window(self, p: float, begin: int, events: list[TurnEvent]) -> None:
        if self._candidate is None:
            if p >= self.threshold:
                self._candidate, self._silence_from = begin, None
            return
        if p < self.neg_threshold:
            if self._silence_from is None:
                self._silence_from = begin
            if self.position - self._silence_from >= self.candidate_gap:
                self._candidate = self._silence_from = None
            return
        if p >= self.threshold:
            self._silence_from = None
        if self.position - self._candidate >= self.min_speech:
            self._start, self._candidate = self._candidate, None
            events.append(SpeechStart(self._start))

    def _speech_window(self, p: float, begin: int, events: list[TurnEvent]) -> None:
        assert self._start is not None
        if p >= self.threshold:
            if self._paused:
                events.append(SpeechResume(self._start))
            self._silence_from = self._turn_hangover = None
            self._paused = False
        elif p < self.neg_threshold and self._silence_from is None:
            self._silence_from = begin
        silence = self.position - self._silence_from if self._silence_from is not None else -1
        if silence >= self._hangover():
            events.append(SpeechEnd(self._start, self._silence_from or 0))
            self._end_turn()
            return
        if self.speculate and silence >= self.speculate and not self._paused:
            self._paused = True
            events.append(SpeechPause(self._start, self._silence_from or 0))
        if self.position - self._start >= self.max_utterance:
            # Cut an endless utterance so it cannot grow without bound; speech continues.
            events.append(SpeechEnd(self._start, self.position, forced=True))
            self._end_turn()
            self._start = self.position
            events.append(SpeechStart(self._start))

    def flush(self) -> list[TurnEvent]:
        """End of input: close an open utterance at the last judged sample."""
        events: list[TurnEvent] = []
        if self._start is not None:
            end = self._silence_from if self._silence_from is not None else self.position
            events.append(SpeechEnd(self._start, end, forced=True))
        self._end_turn()
        self._candidate = None
        return events

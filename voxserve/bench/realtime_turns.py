"""What a Realtime client sees, turned into the bench's figures: the OpenAI Realtime API's
server events (GA names, and the beta names still in use) mapped back onto the utterances a
stream sent, with the definitions of the /v1/stream client (audio_client.py), so the two
transports' figures compare one to one:

- vad_end: last speech frame sent -> `input_audio_buffer.speech_stopped`
- ttfp: first speech frame sent -> first `conversation.item.input_audio_transcription.delta`
- final: last speech frame sent -> its `...input_audio_transcription.completed` (the last one)
- turn: last speech frame sent -> the first `response.output_audio.delta` (beta:
  `response.audio.delta`) of the response that answers it.

"Last speech frame sent" is the instant the piece holding it went out, as on /v1/stream. A
user item is matched to an utterance by its `speech_started.audio_start_ms` (as a /v1/stream
segment by its start_ms); a response answers the item committed last before its
`response.created` (a Realtime response names no input item). Pure: no socket, no clock.
"""

from __future__ import annotations

from typing import Any

from voxserve.bench.program import Script
from voxserve.bench.records import Raw
from voxserve.bench.replies import ReplyAudio, reply_began

AUDIO_DELTAS = ("response.output_audio.delta", "response.audio.delta")  # GA, beta
TRANSCRIPT_DELTA = "conversation.item.input_audio_transcription.delta"
TRANSCRIPT_DONE = "conversation.item.input_audio_transcription.completed"
TRANSCRIPT_FAILED = "conversation.item.input_audio_transcription.failed"


def b64_size(text: str) -> int:
    """Bytes a base64 string decodes to, without decoding it (reply audio is only timed)."""
    return len(text) * 3 // 4 - text.endswith("=") - text.endswith("==")


def error_code(error: object, default: str) -> str:
    """The code of a Realtime error object ({type, code, message, ...}), else its type."""
    if isinstance(error, dict):
        return str(error.get("code") or error.get("type") or default)
    return default


class RealtimeTurns:
    """One session's server events -> samples and counts in `raw`."""

    def __init__(self, raw: Raw, script: Script, *, hangover_s: float, output_rate: int) -> None:
        self.raw = raw
        self.script = script
        self.hangover_s = hangover_s
        self.output_rate = output_rate
        self.first_sent: dict[int, float] = {}  # utterance -> when its first speech went out
        self.last_sent: dict[int, float] = {}  # utterance -> when its last speech went out
        self.items: dict[str, int | None] = {}  # user item id -> utterance
        self.partial_seen: set[int] = set()
        self.finals: dict[int, list[tuple[float, str]]] = {}  # utterance -> (t, transcript)
        self.speaking: str | None = None  # item between speech_started and committed
        self.committed: str | None = None  # last committed item not yet answered
        self.responses: dict[str, int] = {}  # response id -> reply number
        self.answers: dict[int, int | None] = {}  # reply number -> utterance it answers
        self.open: set[str] = set()  # responses created and not done
        self.heard = -1  # highest utterance a speech_started was matched to
        self.replies = ReplyAudio(raw, self._first_audio)
        self.premature: set[int] = set()  # utterances answered while still being spoken

    def idle(self) -> bool:
        """Nothing in flight: the last utterance sent was heard, committed and answered."""
        last = max(self.last_sent, default=-1)
        return (
            self.heard >= last
            and self.speaking is None
            and self.committed is None
            and not self.open
        )

    def on_event(self, event: dict[str, Any], now: float) -> None:
        kind = event.get("type")
        self.raw.counts["events"] += 1
        if kind in AUDIO_DELTAS:
            if event.get("response_id") in self.open:
                self.replies.chunk(b64_size(str(event.get("delta", ""))), now)
            else:
                self.raw.counts["audio_outside_reply"] += 1
        elif kind == "input_audio_buffer.speech_started":
            self._started(str(event.get("item_id")), int(event.get("audio_start_ms", 0)))
        elif kind == "input_audio_buffer.speech_stopped":
            u = self.items.get(str(event.get("item_id")))
            if u is not None and u in self.last_sent:
                self.raw.add("vad_end", now - self.last_sent[u])
        elif kind == "input_audio_buffer.committed":
            self.raw.counts["committed"] += 1
            self.speaking = None
            self.committed = str(event.get("item_id"))
        elif kind == TRANSCRIPT_DELTA:
            self._partial(self.items.get(str(event.get("item_id"))), now)
        elif kind == TRANSCRIPT_DONE:
            self._final(event, now)
        elif kind == TRANSCRIPT_FAILED:
            self.raw.errors["transcription_" + error_code(event.get("error"), "failed")] += 1
        elif kind == "response.created":
            self._created(event.get("response") or {})
        elif kind == "response.done":
            self._done(event.get("response") or {})
        elif kind == "error":
            self.raw.errors[error_code(event.get("error"), "error")] += 1

    def _started(self, item: str, start_ms: int) -> None:
        u = self.script.utterance_at(start_ms)
        self.items[item] = u
        self.speaking = item
        self.raw.counts["segments"] += 1
        if u is not None:
            self.heard = max(self.heard, u)

    def _partial(self, u: int | None, now: float) -> None:
        self.raw.counts["partials"] += 1
        if u is not None and u not in self.partial_seen and u in self.first_sent:
            self.partial_seen.add(u)
            self.raw.add("ttfp", now - self.first_sent[u])

    def _final(self, event: dict[str, Any], now: float) -> None:
        self.raw.counts["finals"] += 1
        u = self.items.get(str(event.get("item_id")))
        if u is None:
            self.raw.counts["finals_unmatched"] += 1
        else:
            self.finals.setdefault(u, []).append((now, str(event.get("transcript") or "")))

    def _created(self, response: dict[str, Any]) -> None:
        rid = str(response.get("id"))
        reply = len(self.responses)
        self.responses[rid] = reply
        self.answers[reply] = self.items.get(self.committed) if self.committed else None
        self.committed = None
        self.open.add(rid)
        self.replies.start({"reply": reply, "sample_rate": self.output_rate})

    def _done(self, response: dict[str, Any]) -> None:
        rid = str(response.get("id"))
        if rid not in self.open:
            self.raw.counts["responses_unmatched"] += 1
            return
        self.open.discard(rid)
        status = response.get("status")
        details = response.get("status_details") or {}
        if status == "cancelled" and details.get("reason") == "turn_detected":
            self.raw.counts["barge_ins"] += 1
        elif status == "failed":
            self.raw.errors["response_" + error_code(details.get("error"), "failed")] += 1
        self.replies.end({"interrupted": status == "cancelled"})

    def _first_audio(self, reply: int, now: float) -> None:
        u = self.answers.get(reply)
        if not reply_began(self.raw, u, now, self.first_sent, self.last_sent, self.premature):
            self.raw.counts["replies_unmatched"] += 1

    def finish(self) -> None:
        """Per utterance whose end was sent: final latency and the transcript for WER, as
        the /v1/stream client counts them (no transcript is an empty hypothesis)."""
        for u, sent in self.last_sent.items():
            self.raw.counts["utterances"] += 1
            finals = self.finals.get(u, [])
            if finals:
                received = max(t for t, _ in finals)
                self.raw.add("final", received - sent)
                self.raw.add("final_minus_hangover", received - sent - self.hangover_s)
            else:
                self.raw.counts["utterances_without_final"] += 1
            text = " ".join(t for _, t in sorted(finals) if t)
            self.raw.transcripts.append((self.script.reference(u), text))

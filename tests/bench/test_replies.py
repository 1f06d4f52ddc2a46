"""Reply audio timing as the client sees it, and merging what several processes measured."""

from __future__ import annotations

import pytest

from voxserve.bench.records import Raw, merged
from voxserve.bench.replies import ReplyAudio, reply_began
from voxserve.bench.step import premature_turn_rate


def test_reply_audio_first_byte_gaps_and_underrun() -> None:
    raw = Raw()
    firsts: list[tuple[int, float]] = []
    replies = ReplyAudio(raw, lambda reply, t: firsts.append((reply, t)))
    replies.start({"type": "tts.start", "reply": 3, "sample_rate": 16000})
    chunk = 3200 * 2  # 200 ms of PCM16
    replies.chunk(chunk, 10.0)
    replies.chunk(chunk, 10.1)
    replies.chunk(chunk, 10.6)  # due at 10.4: the player starves for 0.2 s
    assert replies.playback_end == pytest.approx(10.8)
    replies.end({"type": "tts.end", "reply": 3, "interrupted": False})
    assert firsts == [(3, 10.0)]
    assert raw.samples["underrun"] == [pytest.approx(0.2)]
    assert raw.samples["chunk_gap"] == [pytest.approx(0.1), pytest.approx(0.5)]
    assert raw.counts["replies"] == 1 and raw.counts["audio_ms"] == 600
    replies.chunk(chunk, 11.0)  # no reply open
    assert raw.counts["audio_outside_reply"] == 1


def test_merge_adds_up_processes() -> None:
    a, b = Raw(), Raw()
    a.add("mark_lag", 0.001)
    b.add("mark_lag", 0.002)
    a.errors["close_1011"] += 1
    b.errors["close_1011"] += 2
    a.lateness.append(0.001)
    b.procs.append({"pid": 1})
    b.failed_streams = 2
    total = merged([a, b])
    assert total.samples["mark_lag"] == [0.001, 0.002]
    assert total.errors["close_1011"] == 3 and total.failed_streams == 2
    assert list(total.lateness) == [0.001] and total.procs == [{"pid": 1}]


def test_a_reply_that_begins_while_its_utterance_is_spoken_is_premature() -> None:
    """Utterance 0 ended (a turn latency); utterance 1 began and has not ended: a reply to
    it is premature, counted once however many replies begin in it; the step's rate is over
    the utterances whose end was sent."""
    raw = Raw()
    first, last = {0: 1.0, 1: 5.0}, {0: 3.0}
    premature: set[int] = set()
    assert reply_began(raw, 0, 3.4, first, last, premature)
    assert reply_began(raw, 1, 6.0, first, last, premature)
    assert reply_began(raw, 1, 6.5, first, last, premature)
    assert not reply_began(raw, 2, 7.0, first, last, premature)  # not begun: not matched
    assert [round(s, 3) for s in raw.samples["turn"]] == [0.4]
    assert raw.counts["premature_turns"] == 1
    raw.counts["utterances"] = 4
    assert premature_turn_rate(raw) == 0.25
    assert premature_turn_rate(Raw()) is None  # no replies at all: not an assistant run

"""clip_to_speech: words keep only the time inside the VAD's speech spans they overlap."""

from __future__ import annotations

from voxserve.pipeline.recognition.word_times import clip_to_speech
from voxserve.types import AsrResult, Segment, Word


def result(*words: Word) -> AsrResult:
    text = "".join(w.word for w in words)
    return AsrResult(text, (Segment(text, 0, 5000, words=words),))


def test_leading_and_trailing_silence_leave_the_first_and_last_word() -> None:
    clipped = clip_to_speech(
        result(Word(" Please", 0, 600), Word(" a", 600, 900), Word(" joke.", 900, 3220)),
        [(300, 1440)],
    )
    (segment,) = clipped.segments
    assert [(w.start_ms, w.end_ms) for w in segment.words] == [(300, 600), (600, 900), (900, 1440)]
    assert (segment.start_ms, segment.end_ms) == (300, 1440)


def test_a_word_across_a_pause_keeps_both_spans_and_one_outside_keeps_its_time() -> None:
    clipped = clip_to_speech(
        result(Word(" so", 100, 1500), Word(" um", 1500, 1600), Word(" yes", 2000, 2600)),
        [(200, 700), (1000, 1400), (2100, 2400)],
    )
    words = clipped.segments[0].words
    assert [(w.start_ms, w.end_ms) for w in words] == [(200, 1400), (1500, 1600), (2100, 2400)]


def test_no_words_or_no_spans_is_the_result_as_it_was() -> None:
    plain = AsrResult("hi", (Segment("hi", 0, 900),))
    assert clip_to_speech(plain, [(100, 200)]) is plain
    timed = result(Word(" hi", 0, 900))
    assert clip_to_speech(timed, []) is timed

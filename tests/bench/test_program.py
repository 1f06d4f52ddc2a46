"""The audio program: speech found by level, utterances per sentence, and server times
mapped back to the utterance that was sent."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from voxserve.bench.program import (
    Script,
    build,
    clip_utterances,
    fixture_clips,
    noise_clip,
    scripts,
    speech_regions,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 16000)) / 16000
    return (np.sin(2 * np.pi * 300 * t) * 8000).astype(np.int16)


def quiet(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * 16000), dtype=np.int16)


def test_speech_regions_split_on_long_pauses_only() -> None:
    pcm = np.concatenate([quiet(0.2), tone(0.4), quiet(0.3), tone(0.2), quiet(1.0), tone(0.4)])
    # frames: speech 10..29, short pause, 45..54, long pause, 105..124
    assert speech_regions(pcm) == [(10, 54), (105, 124)]
    assert speech_regions(quiet(1.0)) == []
    assert speech_regions(noise_clip(1.0)) == []  # -60 dBFS is not speech


def test_utterances_per_sentence_when_they_match_the_regions() -> None:
    pcm = np.concatenate([quiet(0.2), tone(0.4), quiet(1.0), tone(0.4)])
    two = clip_utterances(pcm, "Hello there. How are you?", offset=100)
    assert [(u.text, u.first, u.last) for u in two] == [
        ("Hello there.", 110, 129),
        ("How are you?", 180, 199),
    ]
    one = clip_utterances(pcm, "Hello there, how are you?", offset=0)
    assert [(u.first, u.last) for u in one] == [(10, 99)]


def test_script_maps_frames_and_times_to_utterances() -> None:
    clip = np.concatenate([quiet(0.2), tone(0.4), quiet(0.2)])  # 40 frames, speech 10..29
    program = build([(clip, "a"), (clip, "b")], gap_s=1.0)  # 90 frames per clip
    assert program.frames == 180 and program.clip_starts == (0, 90)
    assert [(u.first, u.last) for u in program.utterances] == [(10, 29), (100, 119)]
    script = Script(program)
    assert script.speech_first(10) == 0 and script.speech_last(29) == 0
    assert script.speech_first(100) == 1
    assert script.speech_first(190) == 2  # second loop: utterance numbers go on
    assert script.reference(2) == "a" and script.reference(3) == "b"
    assert script.utterance_at(10 * 20) == 0
    assert script.utterance_at(100 * 20 - 250) == 1  # within the tolerance before speech
    assert script.utterance_at(60 * 20) is None  # in the gap
    assert script.utterance_at((180 + 101) * 20) == 3
    shifted = scripts(program, [1])[0]
    assert shifted.shift == 90 and shifted.speech_first(10) == 1
    assert shifted.utterance_at(10 * 20) == 1
    assert shifted.frame(0) == program.pcm[90 * 640 : 91 * 640]


def test_a_run_never_ends_inside_an_utterance() -> None:
    """The run's last frame is stretched to the end of the utterance it would cut: a
    truncated sentence was answered by the server and counted as a premature turn."""
    clip = np.concatenate([quiet(0.2), tone(0.4), quiet(0.2)])  # speech 10..29 per clip
    script = Script(build([(clip, "a"), (clip, "b")], gap_s=1.0))  # 90 frames per clip
    assert script.whole(5) == 5 and script.whole(10) == 10  # before speech: as it was
    assert script.whole(11) == 30 and script.whole(29) == 30  # inside: to its last frame
    assert script.whole(30) == 30 and script.whole(60) == 60  # after it, in the gap
    assert script.whole(180 + 15) == 180 + 30  # the second loop
    shifted = Script(script.program, shift=90)
    assert shifted.whole(12) == 30  # stream frame 12 plays program frame 102


def test_fixtures_load_with_their_texts() -> None:
    clips = fixture_clips(FIXTURES)
    program = build(clips, gap_s=1.0)
    texts = [u.text for u in program.utterances]
    assert "What time is it?" in texts
    # two_turns.wav holds two sentences with a long pause: two utterances
    assert "Hello, how are you today?" in texts and "I need some help with my order." in texts
    assert program.speech_seconds > 10

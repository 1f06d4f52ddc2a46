"""The append-only rule of Wyoming transcript chunks (server/wyoming/chunks.py): only words
two partials agree on, never a retraction, segments in order; the transcript sent at the
end is the finals joined (the chunks joined, unless a final took back words sent)."""

from __future__ import annotations

from voxserve.server.wyoming.chunks import TranscriptChunks


def run(steps: list[tuple[str, int, str]]) -> tuple[list[str], str]:
    chunks = TranscriptChunks()
    out = []
    for kind, segment, text in steps:
        piece = chunks.final(segment, text) if kind == "final" else chunks.partial(segment, text)
        if piece is not None:
            out.append(piece)
    assert "".join(out) == chunks.text
    finals = [text.strip() for kind, _, text in steps if kind == "final" and text.strip()]
    assert chunks.transcript == " ".join(finals)
    return out, chunks.text


def test_only_words_two_partials_agree_on_then_the_rest_at_the_final() -> None:
    out, text = run(
        [
            ("partial", 0, "Please turn"),
            ("partial", 0, "Please turn on the"),
            ("partial", 0, "Please turn on the light"),
            ("final", 0, "Please turn on the lights."),
        ]
    )
    assert out == ["Please ", "turn on ", "the lights."]
    assert text == "Please turn on the lights."


def test_a_final_that_changed_its_mind_keeps_the_words_sent() -> None:
    out, text = run(
        [
            ("partial", 0, "turn on the"),
            ("partial", 0, "turn on the kit"),
            ("final", 0, "Turn on the kitchen lights."),
        ]
    )
    assert out == ["turn on ", "the kitchen lights."]  # "turn on " is never taken back
    assert text == "turn on the kitchen lights."


def test_the_transcript_is_the_finals_not_a_wrong_partial_sent() -> None:
    """Whisper on 0.5 s of "Stop." twice said "Stop. Stop. Stop." before its final said
    "Stop." (the real model, paced like a microphone): Home Assistant, which reads only
    `transcript`, must get the final."""
    chunks = TranscriptChunks()
    chunks.partial(0, "Stop. Stop. Stop.")
    sent = chunks.partial(0, "Stop. Stop. Stop. Stop.")
    assert sent == "Stop. Stop. "  # sent: chunks cannot take it back
    chunks.final(0, "Stop.")
    chunks.final(1, " Please. ")
    assert chunks.transcript == "Stop. Please."


def test_segments_in_order_a_later_partial_waits_for_the_earlier_final() -> None:
    out, text = run(
        [
            ("partial", 0, "Hello there"),
            ("partial", 0, "Hello there friend"),
            ("partial", 1, "How are"),  # VAD went on while segment 0's final decodes
            ("final", 0, "Hello there, friend."),
            ("partial", 1, "How are you"),
            ("partial", 1, "How are you today"),
            ("final", 1, "How are you today?"),
            ("partial", 1, "How are you today anyway"),  # late: after its final
        ]
    )
    assert out == ["Hello ", "there, friend.", " How are ", "you today?"]
    assert text == "Hello there, friend. How are you today?"


def test_silent_segments_add_nothing() -> None:
    out, text = run([("final", 0, ""), ("final", 1, "  "), ("final", 2, "Yes.")])
    assert out == ["Yes."] and text == "Yes."

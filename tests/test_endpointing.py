"""The end-of-turn rules (pipeline/turns/endpointing.py) on transcripts: pure, no audio."""

from __future__ import annotations

from voxserve.pipeline.turns.endpointing import Ending, EndOfTurn, ending


def test_english_rules() -> None:
    assert ending("What time is it?") is Ending.COMPLETE
    assert ending("I went to the shop and") is Ending.CONTINUES
    assert ending("My number is five five five") is Ending.CONTINUES
    assert ending("Hello.") is Ending.NEUTRAL


def test_another_language_is_never_held_by_english_rules() -> None:
    """No English word in Chinese or Russian text: not "continues" (the longest wait) on
    every turn, but neutral, sooner for a question, longer for a trailing comma."""
    assert ending("我想要一杯咖啡。", "zh") is Ending.NEUTRAL
    assert ending("Который час?", "ru") is Ending.COMPLETE
    assert ending("你好吗？", "zh") is Ending.COMPLETE
    assert ending("Je voudrais un café,", "fr") is Ending.CONTINUES
    assert ending("Ich gehe in den Park und dann a", "de") is Ending.NEUTRAL
    low = EndOfTurn("low")
    assert low.wait_ms("Я хочу кофе.", language="ru") < low.longest_ms
    assert low.wait_ms("Я хочу кофе.", language="ru") == low.wait_ms("Hello.")

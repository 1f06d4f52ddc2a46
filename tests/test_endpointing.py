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


def test_a_last_word_the_decoder_nearly_did_not_write_is_a_guess_after_an_open_phrase() -> None:
    """Whisper completes "Can you book a table for [pause]" as "... for it?": with the
    decoder's weight on stopping before "it" (0.28-0.46 on tiny.en) the phrase continues.
    A sure last word, or an unsure one after words that stand on their own ("... olives
    please.", 0.41), keeps its wait."""
    auto = EndOfTurn("auto")
    question = "Can you book a table for it?"
    continues = auto.wait_ms("Can you book a table for")
    assert auto.wait_ms(question, stop_before_last_word=0.4) == continues
    assert auto.wait_ms(question, stop_before_last_word=0.2) == continues
    assert auto.wait_ms(question, stop_before_last_word=0.05) == auto.wait_ms("What time is it?")
    assert auto.wait_ms(question) == auto.wait_ms("What time is it?")  # an engine that says none
    done = auto.wait_ms("What time is it?")
    assert (
        auto.wait_ms("I would like a pizza with olives please.", stop_before_last_word=0.41) == done
    )
    assert auto.wait_ms("Remind me to call the dentist at 3.", stop_before_last_word=0.0) == done
    assert auto.wait_ms("Yes.", stop_before_last_word=0.9) == auto.wait_ms("Yes.")  # one word
    assert continues > done

"""WhisperAsr on the fixtures: accuracy, bucketed windows, silence, languages, threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.engines.conftest import FIXTURE_TEXTS, load_fixture, normalise, wer
from voxserve.engines.base import AsrEngine
from voxserve.engines.whisper_asr import WhisperAsr, compression_ratio, logits_fit
from voxserve.pipeline.turns.endpointing import EndOfTurn
from voxserve.types import SAMPLE_RATE, AsrOptions

MAX_WER = 0.15


def test_is_an_asr_engine(asr: WhisperAsr) -> None:
    assert isinstance(asr, AsrEngine)
    assert asr.languages == ("en",)
    assert asr.info.kind == "asr" and asr.info.model == "tiny.en"


@pytest.mark.parametrize("name", sorted(FIXTURE_TEXTS))
def test_fixture_transcripts(name: str, asr: WhisperAsr, asr_full_window: WhisperAsr) -> None:
    audio = load_fixture(name)
    text = FIXTURE_TEXTS[name]
    bucketed = asr.transcribe(audio)
    full = asr_full_window.transcribe(audio)
    assert wer(text, bucketed.text) <= MAX_WER, bucketed.text
    assert wer(text, full.text) <= MAX_WER, full.text
    # the short window must not be worse than Whisper's 30 s one
    assert wer(text, bucketed.text) <= wer(text, full.text)
    assert bucketed.language == "en"


def test_partial_path(asr: WhisperAsr) -> None:
    audio = load_fixture("long.wav")
    result = asr.transcribe(audio, partial=True)
    assert wer(FIXTURE_TEXTS["long.wav"], result.text) <= MAX_WER
    assert len(result.segments) == 1


def test_segments_are_relative_to_the_buffer(asr: WhisperAsr) -> None:
    audio = load_fixture("two_turns.wav")
    result = asr.transcribe(audio)
    duration_ms = round(audio.size * 1000 / SAMPLE_RATE)
    assert len(result.segments) >= 1
    previous_end = 0
    for seg in result.segments:
        assert 0 <= seg.start_ms <= seg.end_ms <= duration_ms
        assert seg.start_ms >= previous_end
        previous_end = seg.end_ms
    assert normalise(" ".join(s.text for s in result.segments)) == normalise(result.text)


def test_window_buckets(asr: WhisperAsr, asr_full_window: WhisperAsr) -> None:
    assert asr.window_for(2.0) == 10
    assert asr.window_for(6.0) == 10
    assert asr.window_for(8.0) == 20
    assert asr.window_for(25.0) == 30
    assert asr_full_window.window_for(2.0) == 30


def test_silence_is_empty(asr: WhisperAsr) -> None:
    assert asr.transcribe(np.zeros(2 * SAMPLE_RATE, dtype=np.float32)).text == ""
    assert asr.transcribe(np.zeros(0, dtype=np.float32)).text == ""
    rng = np.random.default_rng(3)
    for level in (0.001, 0.01):  # about -60 and -40 dBFS white noise
        noise = (rng.standard_normal(2 * SAMPLE_RATE) * level).astype(np.float32)
        for partial in (False, True):
            result = asr.transcribe(noise, partial=partial)
            assert result.text == "" and result.segments == (), (level, partial)


def test_a_nan_or_infinite_sample_does_not_silence_the_utterance(asr: WhisperAsr) -> None:
    """One NaN made the whole mel NaN: the words came back as "" with no error."""
    audio = load_fixture("weather.wav")
    for bad in (np.nan, np.inf, -np.inf):
        spoiled = audio.copy()
        spoiled[500] = bad
        text = asr.transcribe(spoiled).text
        assert wer(FIXTURE_TEXTS["weather.wav"], text) <= 0.25, (bad, text)


def test_very_short_audio(asr: WhisperAsr) -> None:
    rng = np.random.default_rng(4)
    for n in (1, 100, 1000):
        noise = (rng.standard_normal(n) * 0.3).astype(np.float32)
        result = asr.transcribe(noise)  # shorter than one STFT frame must not crash
        assert all(seg.end_ms <= max(1, n * 1000 // SAMPLE_RATE) for seg in result.segments)


def test_languages(asr: WhisperAsr) -> None:
    audio = load_fixture("command.wav")
    assert wer(FIXTURE_TEXTS["command.wav"], asr.transcribe(audio, language="en").text) == 0
    with pytest.raises(ValueError, match="fr"):
        asr.transcribe(audio, language="fr")


def test_concurrent_calls_keep_their_own_audio(asr: WhisperAsr) -> None:
    names = ["lights.wav", "reminder.wav", "lights.wav", "reminder.wav"]
    audio = {n: load_fixture(n) for n in set(names)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda n: asr.transcribe(audio[n]).text, names))
    for name, text in zip(names, results, strict=True):
        assert wer(FIXTURE_TEXTS[name], text) <= MAX_WER, (name, text)


def test_longer_than_30_s(asr: WhisperAsr) -> None:
    """Falls back to faster-whisper's sliding 30 s windows."""
    names = ["long.wav", "weather.wav"] * 3
    gap = np.zeros(SAMPLE_RATE, dtype=np.float32)
    audio = np.concatenate([x for n in names for x in (load_fixture(n), gap)])
    assert audio.size > 30 * SAMPLE_RATE
    result = asr.transcribe(audio, partial=True)
    reference = " ".join(FIXTURE_TEXTS[n] for n in names)
    assert wer(reference, result.text) <= MAX_WER, result.text


def test_compression_ratio() -> None:
    assert compression_ratio("") == 0.0
    assert compression_ratio("hello there " * 20) > 2.4
    assert compression_ratio("What time is it?") < 2.4


@pytest.mark.parametrize("partial", [False, True])
def test_batched_results_equal_one_at_a_time(asr: WhisperAsr, partial: bool) -> None:
    """transcribe_many (same-window utterances in one CTranslate2 batch) gives exactly what
    transcribe gives for each audio alone: texts, segments, language."""
    names = ["command.wav", "lights.wav", "weather.wav", "reminder.wav", "two_turns.wav"]
    audios = [load_fixture(n) for n in names]
    audios.append(np.zeros(8000, dtype=np.float32))  # silence inside a batch
    alone = [asr.transcribe(a, partial=partial) for a in audios]
    assert asr.transcribe_many(audios, partial=partial) == alone
    assert asr.transcribe_many([], partial=partial) == []


def test_request_options_in_a_batch_equal_one_at_a_time(asr: WhisperAsr) -> None:
    """With a prompt and word timestamps, a batch still gives each audio's own result, and
    the words tile each segment's text in order."""
    options = AsrOptions(prompt="Kitchen lights, weather report.", word_timestamps=True)
    audios = [load_fixture(n) for n in ("lights.wav", "weather.wav", "command.wav")]
    alone = [asr.transcribe(a, options=options) for a in audios]
    assert asr.transcribe_many(audios, options=options) == alone
    for result in alone:
        for segment in result.segments:
            assert "".join(w.word for w in segment.words).strip() == segment.text
            assert segment.tokens and segment.avg_logprob < 0


def test_english_only_whisper_cannot_translate(asr: WhisperAsr) -> None:
    assert asr.tasks == ("transcribe",)
    with pytest.raises(ValueError, match="cannot translate"):
        asr.transcribe(load_fixture("command.wav"), options=AsrOptions(task="translate"))


def test_a_word_made_up_at_a_pause_does_not_end_the_turn(asr: WhisperAsr) -> None:
    """ "Can you book a table for [660 ms] four people on Friday evening?" decoded at its pause,
    cut anywhere from where the sound stops to 200 ms past it (tiny.en writes "... for it?" at
    most of these cuts, "... for?" at the rest): the end-of-turn wait is always the wait of a
    phrase that goes on, longer than the pause, whatever word the decoder made up. The whole
    utterances keep the wait of a complete sentence."""
    audio = load_fixture("turns/table_for.wav")
    pause = 14410 * SAMPLE_RATE // 10_000  # the last audible sample before the pause (1.441 s)
    turn = EndOfTurn("auto")
    goes_on = turn.wait_ms("Can you book a table for")
    assert goes_on > 660
    for extra_ms in (0, 40, 120, 160, 200):
        result = asr.transcribe(audio[: pause + extra_ms * SAMPLE_RATE // 1000])
        wait = turn.wait_ms(result.text, 1.0, "en", result.stop_before_last_word)
        assert wait == goes_on, (extra_ms, result.text, result.stop_before_last_word)
    complete = turn.wait_ms("What time is it?")
    for name in ("command.wav", "weather.wav", "turns/table_for.wav", "turns/remind_to.wav"):
        result = asr.transcribe(load_fixture(name))
        assert result.stop_before_last_word is not None and result.stop_before_last_word < 0.2
        assert turn.wait_ms(result.text, 1.0, "en", result.stop_before_last_word) == complete
    assert asr.transcribe(audio, partial=True).stop_before_last_word is None  # finals only
    # An upload's windows end no turn: asked for none, a final carries none, same words.
    quiet = asr.transcribe_many([load_fixture("command.wav")], turn_hints=False)[0]
    assert quiet.stop_before_last_word is None
    assert quiet.text == asr.transcribe(load_fixture("command.wav")).text


def test_the_last_word_doubt_keeps_its_logits_within_a_bound(asr: WhisperAsr) -> None:
    """stop_before_last_word reads CTranslate2's logits of every generated token (~207 KB
    each per utterance): a call computes it only while rows x steps fit LOGITS_MAX_BYTES,
    so a batch of decoders looping to their caps cannot hold hundreds of MB for it."""
    vocabulary = 51_865
    assert logits_fit(4, 139, vocabulary)  # the live batch of four turns of ~12 s
    assert not logits_fit(4, 269, vocabulary)  # four 25 s turns: 223 MB
    assert not logits_fit(16, 79, vocabulary)  # a bulk batch of sixteen 6 s windows
    names = ["command.wav", "lights.wav", "weather.wav", "reminder.wav"]
    results = asr.transcribe_many([load_fixture(n) for n in names])
    assert all(r.stop_before_last_word is not None for r in results)
    assert all(r.stop_before_last_word < 0.2 for r in results if r.stop_before_last_word)

"""/v1/audio/transcriptions and /translations with the official `openai` SDK against a real
server and real Whisper tiny.en: uploads in every container (made here with PyAV from the
fixture WAVs), verbose_json with the engine's scores and word times, prompt and temperature
reaching the model, stream=true, translation refused by an English-only model, and damaged
files of each container refused with 400s."""

from __future__ import annotations

import itertools
import json
import re
import typing

import httpx
import numpy as np
import openai
import pytest
from openai.types import AudioModel

from tests.audio_files import CONTAINERS, encode
from tests.conftest import LiveServer
from tests.helpers import fixture_audio, fixture_texts, wer
from voxserve.audio.wav import write_wav

UPLOADED = ("mp3", "m4a", "ogg", "webm", "flac")


def upload(name: str, container: str) -> tuple[str, bytes, str]:
    """A fixture recording as a file of `container` (name, bytes, MIME type)."""
    return f"{name}.{container}", encode(fixture_audio(name), container), CONTAINERS[container][3]


@pytest.mark.parametrize("container", UPLOADED)
def test_every_container_is_transcribed(client: openai.OpenAI, container: str) -> None:
    result = client.audio.transcriptions.create(
        model="whisper-1", file=upload("lights.wav", container)
    )
    assert wer(fixture_texts()["lights.wav"], result.text) <= 0.15, result.text


def test_verbose_json_has_the_engines_scores_and_word_times(client: openai.OpenAI) -> None:
    result = client.audio.transcriptions.create(
        model="whisper-1",
        file=upload("two_turns.wav", "mp3"),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
        language="en",
    )
    assert wer(fixture_texts()["two_turns.wav"], result.text) <= 0.15, result.text
    assert result.duration == pytest.approx(fixture_audio("two_turns.wav").size / 16_000, abs=0.1)
    assert result.segments
    for segment in result.segments:
        assert segment.avg_logprob < 0 and segment.compression_ratio > 0
        assert 0.0 <= segment.no_speech_prob <= 1.0
        assert segment.tokens and segment.temperature == 0.0
        assert 0.0 <= segment.start <= segment.end <= result.duration + 0.05
    words = result.words or []
    assert wer(result.text, " ".join(w.word for w in words)) == 0
    starts = [w.start for w in words]
    assert starts == sorted(starts) and starts[-1] > starts[0]
    assert all(0.0 <= w.start <= w.end <= result.duration + 0.05 for w in words)
    assert all(a.end <= b.start + 1e-6 for a, b in itertools.pairwise(words))


def speech_bounds(samples: np.ndarray) -> tuple[float, float]:
    """Seconds where sound starts and ends: the first and last 10 ms over peak - 40 dB."""
    frames = samples[: samples.size // 160 * 160].astype(np.float64).reshape(-1, 160)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    loud = np.flatnonzero(rms > rms.max() / 100)
    return loud[0] * 0.01, (loud[-1] + 1) * 0.01


@pytest.mark.parametrize("name", ["command.wav", "lights.wav"])
def test_word_times_stay_inside_the_speech_between_known_silences(
    client: openai.OpenAI, name: str
) -> None:
    """1 s of silence before, 2 s after: the aligner gave the first word the leading
    silence and the last the trailing one; clipped to the VAD's speech, the first word
    starts at most 100 ms before the sound does, the last ends at most 200 ms after it."""
    lead, tail = np.zeros(16_000, np.int16), np.zeros(32_000, np.int16)
    padded = np.concatenate([lead, fixture_audio(name), tail])
    onset, offset = speech_bounds(padded)
    result = client.audio.transcriptions.create(
        model="whisper-1",
        file=(f"{name}.wav", write_wav(padded, 16_000), "audio/wav"),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    words = result.words or []
    assert wer(fixture_texts()[name], " ".join(w.word for w in words)) <= 0.2, result.text
    assert onset - 0.1 <= words[0].start < words[0].end, (onset, words[0])
    assert words[-1].start < words[-1].end <= offset + 0.2, (offset, words[-1])
    assert all(onset - 0.1 <= w.start <= w.end <= offset + 0.2 for w in words), words
    segments = result.segments or []
    assert segments[0].start >= onset - 0.1 and segments[-1].end <= offset + 0.2, segments


def test_prompt_and_temperature_reach_the_model(client: openai.OpenAI) -> None:
    """Whisper follows a prompt's style: an upper-case prompt makes upper-case text (so a
    dropped prompt fails this), and the segments report the temperature they were decoded at."""
    file = upload("command.wav", "ogg")
    plain = client.audio.transcriptions.create(model="whisper-1", file=file)
    prompted = client.audio.transcriptions.create(
        model="whisper-1", file=file, prompt="WHAT TIME IS IT"
    )
    assert "time is it" in plain.text.lower() and "WHAT TIME" not in plain.text
    assert "WHAT TIME IS IT" in prompted.text
    warm = client.audio.transcriptions.create(
        model="whisper-1", file=file, response_format="verbose_json", temperature=0.4
    )
    assert warm.segments and {s.temperature for s in warm.segments} == {0.4}


def test_srt_and_vtt_carry_the_segments_times(client: openai.OpenAI) -> None:
    file = upload("long.wav", "flac")
    srt = client.audio.transcriptions.create(model="whisper-1", file=file, response_format="srt")
    vtt = client.audio.transcriptions.create(model="whisper-1", file=file, response_format="vtt")
    times = re.compile(r"(\d\d):(\d\d):(\d\d)[,.](\d{3}) --> (\d\d):(\d\d):(\d\d)[,.](\d{3})$")
    for body, first in ((srt, "1"), (vtt, "WEBVTT")):
        lines = str(body).splitlines()
        assert lines[0] == first
        spans = [m.groups() for m in map(times.match, lines) if m]
        assert spans and spans[-1][4:] != ("00", "00", "00", "000")  # real end times
    assert wer(fixture_texts()["long.wav"], " ".join(str(srt).splitlines()[2::4])) <= 0.15


def test_stream_sends_deltas_as_windows_are_decoded_then_done(client: openai.OpenAI) -> None:
    """Four recordings, ~19 s: more than one 14 s window, so more than one delta."""
    names = ("long.wav", "reminder.wav", "weather.wav", "two_turns.wav")
    audio = np.concatenate([fixture_audio(n) for n in names])
    file = ("four.webm", encode(audio, "webm"), "audio/webm")
    events = list(client.audio.transcriptions.create(model="whisper-1", file=file, stream=True))
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and kinds.count("transcript.text.done") == 1
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) >= 2
    done = events[-1]
    assert done.type == "transcript.text.done"
    assert "".join(deltas) == done.text
    expected = " ".join(fixture_texts()[n] for n in names)
    assert wer(expected, done.text) <= 0.15, done.text


def test_damaged_files_of_every_container_are_400s(live_server: LiveServer) -> None:
    """Cut short at several points, or the header followed by garbage, or garbage alone: a
    400 invalid_audio naming the problem, never a 500 (and nothing is transcribed)."""
    rng = np.random.default_rng(23)
    garbage = rng.integers(0, 256, 4_000, dtype=np.uint8).tobytes()
    url = live_server.http_url + "/v1/audio/transcriptions"
    answers: dict[str, tuple[int, str]] = {}
    for container in (*UPLOADED, "wav"):
        data = encode(fixture_audio("long.wav"), container)
        cases = {f"cut{int(f * 100)}": data[: int(len(data) * f)] for f in (0.3, 0.7)}
        cases |= {"head+garbage": data[:200] + garbage, "garbage": garbage}
        for case, body in cases.items():
            response = httpx.post(
                url, files={"file": (f"a.{container}", body)}, data={"model": "whisper-1"}
            )
            code = response.json().get("error", {}).get("code", "") if response.content else ""
            answers[f"{container} {case}"] = (response.status_code, code)
    assert all(answer == (400, "invalid_audio") for answer in answers.values()), json.dumps(
        answers, indent=1
    )


def test_silence_has_no_segments_or_cues(client: openai.OpenAI) -> None:
    """Nothing said: empty text, no segment (not one empty span with placeholder scores)."""
    quiet = ("quiet.wav", encode(np.zeros(16_000, dtype=np.int16), "wav"), "audio/wav")
    verbose = client.audio.transcriptions.create(
        model="whisper-1", file=quiet, response_format="verbose_json"
    )
    assert verbose.text == "" and verbose.segments == []
    srt = client.audio.transcriptions.create(model="whisper-1", file=quiet, response_format="srt")
    assert str(srt).strip() == ""


def test_every_transcription_model_of_the_sdk_is_served(client: openai.OpenAI) -> None:
    """The SDK's AudioModel names (its newest default first among them): each transcribes;
    only the diarizing model, whose speakers the engines cannot tell, is refused."""
    names = typing.get_args(AudioModel)
    file = upload("command.wav", "wav")
    for name in names:
        if name == "gpt-4o-transcribe-diarize":
            with pytest.raises(openai.BadRequestError):
                client.audio.transcriptions.create(model=name, file=file)
            continue
        text = client.audio.transcriptions.create(model=name, file=file).text
        assert wer(fixture_texts()["command.wav"], text) <= 0.15, (name, text)
    assert "gpt-transcribe" in names

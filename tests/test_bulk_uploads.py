"""Uploads as bulk work (pipeline/recognition/bulk.py, pipeline/recognition/windows.py): cut into
windows of bounded length at pauses, one bulk ASR call per window, joined on the recording's time
line; refused up front (503 `overloaded`, Retry-After) when the bulk work ahead leaves no time.

Windows are checked as a property over generated recordings (speech-like bursts and pauses
of any lengths); the HTTP route on a real server with a fake ASR engine that names each
window's tone, so a cut through a tone would show as a word said twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeAsr, fake_runtime, silence, tone, word_for
from voxserve.audio.wav import write_wav
from voxserve.config import AsrConfig, StageConfig, load_settings
from voxserve.pipeline.recognition.bulk import join_windows
from voxserve.pipeline.recognition.speech_windows import SpeechWindow
from voxserve.pipeline.recognition.windows import cut_windows
from voxserve.types import AsrResult, Segment

RATE = 16_000
PAUSE_S = 0.4
WINDOW_S = 5.0  # the smallest asr.bulk_window_s: many windows from little audio
TONES = (300.0, 500.0, 700.0, 900.0, 1100.0, 1300.0, 1500.0)


@st.composite
def recordings(draw: st.DrawFn) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Bursts of noise (0.2-6 s) and pauses (0.3-1.5 s); returns audio and its pauses."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    parts: list[np.ndarray] = []
    pauses: list[tuple[int, int]] = []
    at = 0
    for _ in range(draw(st.integers(1, 30))):
        burst = draw(st.floats(0.2, 6.0))
        parts.append(rng.normal(0, 0.2, int(burst * RATE)).astype(np.float32))
        at += parts[-1].size
        pause = draw(st.floats(0.3, 1.5))
        parts.append(rng.normal(0, 1e-4, int(pause * RATE)).astype(np.float32))
        pauses.append((at, at + parts[-1].size))
        at += parts[-1].size
    return np.concatenate(parts), pauses


@settings(max_examples=120, deadline=None)
@given(recording=recordings(), max_s=st.sampled_from([5.0, 14.0, 30.0]))
def test_windows_cover_the_recording_and_cut_in_pauses(
    recording: tuple[np.ndarray, list[tuple[int, int]]], max_s: float
) -> None:
    """Windows are consecutive, cover every sample, are at most max_s long, and each cut
    falls inside a pause whenever the last half of its window holds one."""
    audio, pauses = recording
    windows = cut_windows(audio, max_s)
    assert windows[0][0] == 0 and windows[-1][1] == audio.size
    limit = int(max_s * RATE)
    for (start, end), (following, _) in zip(windows, [*windows[1:], (audio.size, 0)], strict=True):
        assert end == following and 0 < end - start <= limit
    for start, end in windows[:-1]:
        searched = (start + limit // 2, start + limit)
        if any(a >= searched[0] and b <= searched[1] for a, b in pauses):
            assert any(a <= end <= b for a, b in pauses), (start, end)


def test_joined_windows_keep_the_recording_time_line() -> None:
    second = RATE
    joined = join_windows(
        [
            (
                SpeechWindow(((0, 5 * second),)),
                AsrResult("one two", (Segment("one two", 100, 4_000),)),
            ),
            (SpeechWindow(((5 * second, 9 * second),)), AsrResult("")),  # silence: nothing
            (SpeechWindow(((9 * second, 12 * second),)), AsrResult("three")),  # no segments
            (  # two pieces end to end (the silence between them skipped): times map back
                SpeechWindow(((20 * second, 22 * second), (30 * second, 33 * second))),
                AsrResult(
                    "four five", (Segment("four", 500, 2_000), Segment("five", 2_000, 4_500))
                ),
            ),
        ]
    )
    assert joined.text == "one two three four five"
    assert joined.segments == (
        Segment("one two", 100, 4_000),
        Segment("three", 9_000, 12_000),
        Segment("four", 20_500, 22_000),  # an end on the seam: the first piece's end
        Segment("five", 30_000, 32_500),  # a start on the seam: the second piece's start
    )
    alone = AsrResult("only", (Segment("only", 0, 900),))
    assert join_windows([(SpeechWindow(((0, second),)), alone)]) is alone


def _tones(*freqs: float, seconds: float = 1.5) -> np.ndarray:
    """Tones (one fake word each) with a pause after each."""
    parts: list[np.ndarray] = []
    for freq in freqs:
        parts += [tone(freq, seconds, amplitude=0.3), silence(PAUSE_S)]
    return np.concatenate(parts)


class ToneWordsAsr(FakeAsr):
    """FakeAsr naming every tone of the buffer in turn (runs of loud 10 ms frames), so a
    window cut through a tone says that word twice."""

    def transcribe(
        self, audio: np.ndarray, *, language: str | None = None, partial: bool = False
    ) -> AsrResult:
        self.calls.append((audio.size, partial))
        time.sleep(self.delay_s)
        frame = RATE // 100
        whole = audio[: audio.size // frame * frame].reshape(-1, frame)
        loud = np.abs(whole).max(axis=1) > 0.05
        words: list[str] = []
        run_start: int | None = None
        for index, is_loud in enumerate([*loud, False]):
            if is_loud and run_start is None:
                run_start = index
            elif not is_loud and run_start is not None:
                run = whole[run_start:index].reshape(-1)
                peak = float(np.argmax(np.abs(np.fft.rfft(run)))) * RATE / run.size
                words.append(word_for(peak))
                run_start = None
        return AsrResult(" ".join(words))


@pytest.fixture(scope="module")
def slow_asr_server() -> Iterator[tuple[LiveServer, ToneWordsAsr]]:
    """Fake ASR taking 0.5 s per call, a 0.4 s ASR timeout and one-shot budget: an upload's
    budget is 0.4 s plus its length; 5 s windows."""
    base = load_settings(port=free_port(), log_level="warning")
    pipeline = base.pipeline.model_copy(update={"asr": StageConfig(concurrency=2, timeout_s=0.4)})
    # One window per bulk batch: each upload window is one 0.5 s engine call, as before.
    asr_cfg = AsrConfig(
        bulk_window_s=WINDOW_S,
        bulk_batch_s=WINDOW_S,
        one_shot_budget_ms=400,
        one_shot_budget_per_audio=1.0,
    )
    settings = base.model_copy(update={"pipeline": pipeline, "asr": asr_cfg})
    asr = ToneWordsAsr(delay_s=0.5)
    live = start_server(settings, fake_runtime(settings, asr=asr))
    yield live, asr
    stop_server(live)


def _post(url: str, audio: np.ndarray, fmt: str = "verbose_json") -> httpx.Response:
    return httpx.post(
        url + "/v1/audio/transcriptions",
        files={"file": ("a.wav", write_wav(audio, RATE), "audio/wav")},
        data={"model": "whisper-1", "response_format": fmt},
        timeout=60,
    )


def test_an_upload_is_transcribed_window_by_window(
    slow_asr_server: tuple[LiveServer, ToneWordsAsr],
) -> None:
    """7 tones of 1.5 s, 0.4 s apart (13.3 s): windows of at most 5 s cut in the pauses,
    every word once and in order, segments on the upload's time line (the trailing
    silence past the VAD's padding is not decoded)."""
    live, asr = slow_asr_server
    asr.calls.clear()
    reply = _post(live.http_url, _tones(*TONES))
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["text"].split() == [word_for(f) for f in TONES]
    sizes = [size for size, partial in asr.calls if not partial]
    assert len(sizes) >= 3 and max(sizes) <= WINDOW_S * RATE
    starts = [segment["start"] for segment in body["segments"]]
    assert starts[0] == 0 and starts == sorted(starts) and len(set(starts)) == len(starts)
    last_tone_end = body["duration"] - PAUSE_S
    assert last_tone_end <= body["segments"][-1]["end"] <= body["duration"] + 0.01


def test_an_upload_that_could_not_finish_in_time_is_refused_up_front(
    slow_asr_server: tuple[LiveServer, ToneWordsAsr],
) -> None:
    """While a long upload holds bulk's slot (windows take 0.5 s), a 0.5 s upload (budget
    0.9 s: 0.4 s plus its length) would be done in 1-2.5 s: 503 `overloaded` with
    Retry-After (how late it would be, in whole seconds) at once, not a 504 after the wait.
    Once the long one is done, it is served."""
    live, _ = slow_asr_server
    stage = live.runtime.stages.stage("asr")
    answers: list[httpx.Response] = []
    long = threading.Thread(target=lambda: answers.append(_post(live.http_url, _tones(*TONES))))
    long.start()
    deadline = time.monotonic() + 10
    while not (stage.bulk_call_s > 0 and stage.bulk_held) and time.monotonic() < deadline:
        time.sleep(0.02)
    small = _tones(500.0, seconds=0.1)
    began = time.monotonic()
    refused = _post(live.http_url, small, "json")
    assert time.monotonic() - began < 0.5
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "overloaded"
    assert 1 <= int(refused.headers["retry-after"]) <= 3
    assert "past its budget" in refused.json()["error"]["message"]
    assert live.runtime.stages.stage("asr").refused_late >= 1
    long.join(30)
    assert answers and answers[0].status_code == 200
    served = _post(live.http_url, small, "json")
    assert served.status_code == 200, served.text

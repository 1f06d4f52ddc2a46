"""/v1/audio/speech in every OpenAI response format, raw and as SSE, through the official
`openai` SDK against a real server on real piper: each format is decoded back with PyAV
(the codec library the server encodes with) and, for mp3 and opus, transcribed by the
server's own whisper to the words that were asked for."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from typing import Literal

import av
import numpy as np
import openai
import pytest

from tests.conftest import LiveServer
from tests.helpers import tts_calls_after_disconnect
from tests.test_http_audio import word_error_rate
from voxserve.audio.pcm import Int16Array
from voxserve.audio.wav import write_wav

Format = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
TEXT = "Please open the kitchen window before dinner."
# The types OpenAI sends, written out, not speech_output.MEDIA_TYPES: the test checks that table.
CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/opus",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
RATES = {"mp3": 24_000, "opus": 48_000, "aac": 24_000, "flac": 24_000, "wav": 16_000}
CONTAINERS = {"mp3": "mp3", "opus": "ogg", "aac": "aac", "flac": "flac", "wav": "wav"}


def decode(data: bytes, fmt: str) -> tuple[Int16Array, int]:
    """Mono int16 samples and rate, decoded by FFmpeg (PyAV) from the container's bytes."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.int16), 24_000
    with av.open(io.BytesIO(data), "r") as container:
        assert container.format.name.split(",")[0] == CONTAINERS[fmt]
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="s16", layout="mono", rate=stream.rate)
        parts = [
            out.to_ndarray().reshape(-1)
            for frame in container.decode(stream)
            for out in resampler.resample(frame)
        ]
        rate = stream.rate
    return np.concatenate(parts).astype(np.int16), rate


def seconds(data: bytes, fmt: str) -> float:
    samples, rate = decode(data, fmt)
    return samples.size / rate


@pytest.fixture(scope="module")
def reference(client: openai.OpenAI) -> Callable[[int], float]:
    """The length of TEXT as raw PCM at a rate: what every format at that rate must hold.
    Piper's durations vary from one synthesis to the next; the TTS cache keeps one per rate
    (any format), so a format is compared with the PCM of its own rate."""
    lengths: dict[int, float] = {}

    def length(rate: int) -> float:
        if rate not in lengths:
            pcm = client.audio.speech.create(
                model="tts-1",
                voice="joe",
                input=TEXT,
                response_format="pcm",
                extra_body={"sample_rate": rate},
            ).read()
            lengths[rate] = len(pcm) / 2 / rate
        return lengths[rate]

    return length


@pytest.fixture(scope="module")
def reference_s(reference: Callable[[int], float]) -> float:
    return reference(24_000)


@pytest.mark.parametrize("fmt", list(CONTENT_TYPES))
def test_each_format_decodes_to_the_speech(
    client: openai.OpenAI, reference: Callable[[int], float], fmt: Format
) -> None:
    raw = client.audio.speech.with_raw_response.create(
        model="tts-1", voice="joe", input=TEXT, response_format=fmt
    )
    assert raw.headers["content-type"] == CONTENT_TYPES[fmt]
    samples, rate = decode(raw.content, fmt)
    assert rate == RATES.get(fmt, 24_000)
    # Codecs pad a frame or two at the ends (mp3 and aac priming): tens of milliseconds.
    assert samples.size / rate == pytest.approx(reference(rate), abs=0.12)
    assert int(np.abs(samples).max()) > 1000  # speech, not silence


@pytest.mark.parametrize("fmt", ["mp3", "opus"])
def test_compressed_speech_transcribes_back(client: openai.OpenAI, fmt: Format) -> None:
    data = client.audio.speech.create(
        model="tts-1", voice="joe", input=TEXT, response_format=fmt
    ).read()
    samples, rate = decode(data, fmt)
    result = client.audio.transcriptions.create(
        model="whisper-1", file=("speech.wav", write_wav(samples, rate), "audio/wav")
    )
    assert word_error_rate(TEXT, result.text) <= 0.15, result.text


def test_default_format_is_mp3(client: openai.OpenAI) -> None:
    raw = client.audio.speech.with_raw_response.create(model="tts-1", voice="joe", input=TEXT)
    assert raw.headers["content-type"] == "audio/mpeg"
    assert seconds(raw.content, "mp3") > 1.0


def test_mp3_streams_before_synthesis_ends(client: openai.OpenAI, live_server: LiveServer) -> None:
    """The first mp3 bytes reach the client while the engine is still synthesising (a text
    no other test asks for: a cache hit would be whole at once)."""
    text = "Streaming in mp3. " + " ".join(
        f"Sentence {n} is on its way to the listener." for n in range(1, 4)
    )
    stage = live_server.runtime.stages.stage("tts")
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="joe", input=text, response_format="mp3"
    ) as response:
        chunks = response.iter_bytes()
        first = next(chunks)
        calls_at_first = stage.calls
        data = first + b"".join(chunks)
    assert first
    assert stage.calls > calls_at_first  # chunks were still being synthesised
    assert seconds(data, "mp3") > 4.0


def sse_events(client: openai.OpenAI, fmt: Format, text: str) -> list[dict[str, object]]:
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts",
        voice="joe",
        input=text,
        response_format=fmt,
        stream_format="sse",
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    return [json.loads(line.removeprefix("data: ")) for line in lines]


@pytest.mark.parametrize("fmt", ["mp3", "pcm"])
def test_sse_deltas_then_done_with_usage(
    client: openai.OpenAI, reference_s: float, fmt: Format
) -> None:
    events = sse_events(client, fmt, TEXT)
    *deltas, done = events
    assert deltas and all(set(e) == {"type", "audio"} for e in deltas)
    assert {e["type"] for e in deltas} == {"speech.audio.delta"}
    assert done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert isinstance(usage, dict)
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    audio = b"".join(base64.b64decode(str(e["audio"])) for e in deltas)
    assert seconds(audio, fmt) == pytest.approx(reference_s, abs=0.12)


def test_speed_two_is_shorter(client: openai.OpenAI, reference_s: float) -> None:
    """Speed 2 halves each phoneme's length (piper's length_scale), not the pauses between
    pieces: 0.61-0.69 of speed 1 for TEXT in raw PCM (12 x 12 syntheses, 2026-12-04; piper
    samples its durations, +-3.5% a synthesis). Speed 1.5 would be ~0.76 and none ~1.0.
    Compared as PCM at the reference's rate: a codec's frame padding (mp3 adds ~50 ms,
    which made 0.71 in one CI run) is no part of the speed."""
    fast = client.audio.speech.create(
        model="tts-1", voice="joe", input=TEXT, response_format="pcm", speed=2.0
    ).read()
    assert seconds(fast, "pcm") < 0.7 * reference_s


def test_instructions_are_accepted(client: openai.OpenAI) -> None:
    audio = client.audio.speech.create(
        model="gpt-4o-mini-tts",
        voice="joe",
        input=TEXT,
        instructions="Speak in a cheerful tone.",
        response_format="wav",
    ).read()
    assert audio[:4] == b"RIFF"


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("response_format", "ogg", "unsupported_encoding"),
        ("stream_format", "chunks", "invalid_parameter"),
        ("speed", 4.5, "invalid_parameter"),
        ("speed", 0.2, "invalid_parameter"),
        ("instructions", 7, "invalid_parameter"),
        ("sample_rate", 22_050, "unsupported_sample_rate"),  # opus takes no 22.05 kHz
    ],
)
def test_bad_fields_are_400(client: openai.OpenAI, field: str, value: object, code: str) -> None:
    extra = {field: value, "response_format": "opus"} if field == "sample_rate" else {field: value}
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(model="tts-1", voice="joe", input=TEXT, extra_body=extra)
    error = caught.value.response.json()["error"]
    assert error["code"] == code and field in error["message"]


def test_disconnect_mid_mp3_stops_synthesis(live_server: LiveServer) -> None:
    """Closing the connection after the first mp3 bytes stops the engine between chunks
    (and the encoder is released)."""
    text = " ".join(f"This is encoded sentence number {n} of a long reply." for n in range(40))
    stage = live_server.runtime.stages.stage("tts")
    before = stage.calls
    body = {"input": text, "voice": "joe", "response_format": "mp3"}
    settled, later = tts_calls_after_disconnect(live_server.http_url, stage, body)
    assert later == settled
    assert settled - before < 20

"""Every documented error of the HTTP audio routes: the status code and the stable error.code
in OpenAI's error shape, over a real socket against the real server."""

from __future__ import annotations

import io
import threading
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from tests.conftest import LiveServer, free_port
from voxserve.config import load_settings
from voxserve.errors import ErrorCode
from voxserve.runtime import Runtime
from voxserve.server.app import create_app
from voxserve.server.session.errors import http_status

FIXTURE = Path(__file__).parent / "fixtures" / "command.wav"


def assert_error(response: httpx.Response, code: ErrorCode, *mentions: str) -> dict[str, Any]:
    """The status comes from the one code->status table; the body is OpenAI's error shape."""
    assert response.status_code == http_status(code), response.text
    assert 400 <= response.status_code < 600
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code.value
    assert error["message"] and error["type"]
    for text in mentions:
        assert text in error["message"]
    assert response.headers["x-voxserve-trace-id"]
    return error


@pytest.fixture(scope="module")
def http(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.http_url, timeout=60) as client:
        yield client


def speech(http: httpx.Client, **body: Any) -> httpx.Response:
    return http.post("/v1/audio/speech", json={"input": "Hello there.", "voice": "joe", **body})


def upload(http: httpx.Client, data: bytes, **fields: str) -> httpx.Response:
    return http.post(
        "/v1/audio/transcriptions", files={"file": ("a.wav", data, "audio/wav")}, data=fields
    )


# --- speech ---------------------------------------------------------------------------------


def test_speech_invalid_json(http: httpx.Client) -> None:
    response = http.post(
        "/v1/audio/speech", content=b'{"input": ', headers={"content-type": "application/json"}
    )
    assert_error(response, ErrorCode.INVALID_JSON)
    assert_error(http.post("/v1/audio/speech", json=["hello"]), ErrorCode.INVALID_JSON)


def test_speech_body_too_large(http: httpx.Client, live_server: LiveServer) -> None:
    limit = live_server.settings.limits.max_message_bytes
    response = speech(http, padding="x" * limit)
    assert_error(response, ErrorCode.MESSAGE_TOO_LARGE)


def test_speech_body_too_large_without_content_length(
    http: httpx.Client, live_server: LiveServer
) -> None:
    """A chunked body has no Content-Length: the cap is enforced while reading."""
    limit = live_server.settings.limits.max_message_bytes

    def body() -> Iterator[bytes]:
        yield b'{"input": "'
        for _ in range(limit // 4096 + 2):
            yield b"x" * 4096
        yield b'"}'

    response = http.post(
        "/v1/audio/speech", content=body(), headers={"content-type": "application/json"}
    )
    assert_error(response, ErrorCode.MESSAGE_TOO_LARGE)


def test_speech_unknown_model(http: httpx.Client) -> None:
    assert_error(speech(http, model="tts-9"), ErrorCode.UNKNOWN_MODEL, "tts-1", "piper")


def test_speech_unknown_voice(http: httpx.Client) -> None:
    assert_error(speech(http, voice="nobody"), ErrorCode.UNKNOWN_VOICE, "joe")


def test_speech_voice_of_another_engine(http: httpx.Client) -> None:
    assert_error(speech(http, model="espeak", voice="joe"), ErrorCode.UNKNOWN_VOICE, "espeak")


@pytest.mark.parametrize("fmt", ["ogg", "m4a", "MP3", "wave"])
def test_speech_unsupported_format(http: httpx.Client, fmt: str) -> None:
    error = assert_error(speech(http, response_format=fmt), ErrorCode.UNSUPPORTED_ENCODING)
    assert all(name in error["message"] for name in ("mp3", "opus", "aac", "flac", "wav", "pcm"))


@pytest.mark.parametrize("speed", [0.1, 4.5, "fast", True])
def test_speech_bad_speed(http: httpx.Client, speed: object) -> None:
    assert_error(speech(http, speed=speed), ErrorCode.INVALID_PARAMETER)


@pytest.mark.parametrize("text", ["", "   \n "])
def test_speech_empty_text(http: httpx.Client, text: str) -> None:
    assert_error(speech(http, input=text), ErrorCode.EMPTY_TEXT)


def test_speech_text_too_long(http: httpx.Client, live_server: LiveServer) -> None:
    text = "word " * (live_server.settings.limits.max_text_chars // 5 + 10)
    assert_error(speech(http, input=text), ErrorCode.TEXT_TOO_LONG)


@pytest.mark.parametrize("body", [{"input": None}, {"input": 42}, {"voice": "joe"}])
def test_speech_input_missing_or_not_text(http: httpx.Client, body: dict[str, Any]) -> None:
    response = http.post("/v1/audio/speech", json=body)
    assert_error(response, ErrorCode.INVALID_PARAMETER, "input")


def test_speech_bad_sample_rate(http: httpx.Client) -> None:
    assert_error(speech(http, sample_rate=12_345), ErrorCode.UNSUPPORTED_SAMPLE_RATE)
    assert_error(speech(http, sample_rate="fast"), ErrorCode.INVALID_PARAMETER)


@pytest.mark.parametrize("value", ["SSE", "ndjson", 1])
def test_speech_bad_stream_format(http: httpx.Client, value: object) -> None:
    assert_error(speech(http, stream_format=value), ErrorCode.INVALID_PARAMETER, "stream_format")


# --- transcriptions -------------------------------------------------------------------------


def test_transcription_not_wav(http: httpx.Client) -> None:
    assert_error(upload(http, b"ID3\x03\x00 definitely an mp3 " * 20), ErrorCode.INVALID_AUDIO)


def test_transcription_empty_file(http: httpx.Client) -> None:
    assert_error(upload(http, b""), ErrorCode.EMPTY_AUDIO)


def test_transcription_wav_without_samples(http: httpx.Client) -> None:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16_000)
    assert_error(upload(http, buffer.getvalue()), ErrorCode.EMPTY_AUDIO)


def test_transcription_upload_too_large(http: httpx.Client, live_server: LiveServer) -> None:
    limit = live_server.settings.limits.max_upload_bytes
    big = FIXTURE.read_bytes() + b"\x00" * limit
    assert_error(upload(http, big), ErrorCode.MESSAGE_TOO_LARGE)


def test_transcription_upload_too_large_chunked(
    http: httpx.Client, live_server: LiveServer
) -> None:
    """Without Content-Length the server still stops reading once past the limit."""
    limit = live_server.settings.limits.max_upload_bytes
    boundary = "voxserve-test-boundary"

    def body() -> Iterator[bytes]:
        yield (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\n'
        ).encode()
        block = b"\x00" * (1 << 20)
        for _ in range(limit // len(block) + 2):
            yield block
        yield f"\r\n--{boundary}--\r\n".encode()

    try:
        response = http.post(
            "/v1/audio/transcriptions",
            content=body(),
            headers={"content-type": f"multipart/form-data; boundary={boundary}"},
        )
    except httpx.TransportError:
        pytest.skip("the client could not finish writing after the server refused the body")
    assert_error(response, ErrorCode.MESSAGE_TOO_LARGE)


def test_transcription_unknown_model(http: httpx.Client) -> None:
    response = upload(http, FIXTURE.read_bytes(), model="whisper-9")
    assert_error(response, ErrorCode.UNKNOWN_MODEL, "whisper-1")


def test_transcription_unknown_language(http: httpx.Client) -> None:
    response = upload(http, FIXTURE.read_bytes(), language="xx")
    assert_error(response, ErrorCode.UNKNOWN_LANGUAGE, "en")


def test_transcription_missing_file(http: httpx.Client) -> None:
    response = http.post("/v1/audio/transcriptions", data={"model": "whisper-1"})
    assert_error(response, ErrorCode.INVALID_PARAMETER, "file")
    response = http.post(
        "/v1/audio/transcriptions",
        files={"other": ("a.wav", FIXTURE.read_bytes(), "audio/wav")},
    )
    assert_error(response, ErrorCode.INVALID_PARAMETER, "file")


@pytest.mark.parametrize("fmt", ["diarized_json", "xml"])
def test_transcription_unsupported_format(http: httpx.Client, fmt: str) -> None:
    response = upload(http, FIXTURE.read_bytes(), response_format=fmt)
    assert_error(response, ErrorCode.UNSUPPORTED_ENCODING, "verbose_json")


def test_transcription_streaming_needs_a_text_format(http: httpx.Client) -> None:
    response = upload(http, FIXTURE.read_bytes(), stream="true", response_format="srt")
    assert_error(response, ErrorCode.INVALID_PARAMETER, "json or text")
    assert_error(upload(http, FIXTURE.read_bytes(), stream="yes"), ErrorCode.INVALID_PARAMETER)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"temperature": "2"}, "temperature"),
        ({"temperature": "warm"}, "temperature"),
        ({"timestamp_granularities[]": "sentence"}, "timestamp granularity"),
    ],
)
def test_transcription_bad_fields(http: httpx.Client, fields: dict[str, str], named: str) -> None:
    assert_error(upload(http, FIXTURE.read_bytes(), **fields), ErrorCode.INVALID_PARAMETER, named)


# --- the same errors as the official SDK reports them ---------------------------------------


def test_sdk_unknown_voice(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(model="tts-1", voice="zed", input="Hello.")
    assert caught.value.code == ErrorCode.UNKNOWN_VOICE.value
    assert "joe" in caught.value.message and "alloy" in caught.value.message


def test_sdk_empty_text(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(model="tts-1", voice="joe", input=" ")
    assert caught.value.code == ErrorCode.EMPTY_TEXT.value


def test_sdk_unknown_language(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught, FIXTURE.open("rb") as file:
        client.audio.transcriptions.create(model="whisper-1", file=file, language="xx")
    assert caught.value.code == ErrorCode.UNKNOWN_LANGUAGE.value


def test_sdk_unknown_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught, FIXTURE.open("rb") as file:
        client.audio.transcriptions.create(model="whisper-large", file=file)
    assert caught.value.code == ErrorCode.UNKNOWN_MODEL.value


# --- before the models are loaded -----------------------------------------------------------


@pytest.fixture(scope="module")
def loading_server() -> Iterator[str]:
    """A real server whose engines never load (lifespan off): the state right after start."""
    settings = load_settings(port=free_port(), log_level="warning")
    runtime = Runtime(settings)
    config = uvicorn.Config(
        create_app(runtime),
        host="127.0.0.1",
        port=settings.port,
        lifespan="off",
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{settings.port}"
    server.should_exit = True
    thread.join(timeout=10)
    runtime.close()


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("POST", "/v1/audio/speech", {"json": {"input": "Hello.", "voice": "joe"}}),
        (
            "POST",
            "/v1/audio/transcriptions",
            {"files": {"file": ("a.wav", FIXTURE.read_bytes(), "audio/wav")}},
        ),
        ("GET", "/v1/voices", {}),
        ("GET", "/v1/models", {}),
    ],
)
def test_not_ready(loading_server: str, method: str, path: str, kwargs: dict[str, Any]) -> None:
    response = httpx.request(method, loading_server + path, timeout=10, **kwargs)
    assert response.status_code == 503
    assert response.headers["retry-after"]
    assert response.json()["error"]["code"] == ErrorCode.NOT_READY.value

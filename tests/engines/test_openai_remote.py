"""The `openai` ASR and TTS engines end to end (issue 24, item 5): a real voxserve process
with its default engines (Whisper tiny.en, piper) is the remote, and a front voxserve
process configured only through VOXSERVE_ENGINES__ASR / __TTS JSON (as docs/engines.md
shows) speaks to it over its OpenAI API. The official `openai` SDK and a /v1/stream
session use the front; the remote's own API key is required, so a wrong key is a refusal
the front reports; a remote that is down is `engine_unavailable`. No cache on either side:
every answer is the remote's work."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeVad, silence
from tests.helpers import fixture_audio, fixture_texts, stop_process, wait_ready, wer
from tests.test_cli import clean_env
from tests.wsclient import collect, of_type, send_audio, start
from voxserve.audio.resample import resample
from voxserve.audio.wav import write_wav
from voxserve.config import CacheConfig, DegradeConfig, TtsConfig, load_settings
from voxserve.engines.loaded import Engines
from voxserve.engines.openai_asr import OpenAIAsr
from voxserve.engines.openai_tts import OpenAITts
from voxserve.engines.responders import EchoResponder
from voxserve.errors import ErrorCode, VoxError
from voxserve.runtime import Runtime
from voxserve.types import SAMPLE_RATE

REMOTE_KEY = "remote-secret"
QUIET = ("--grpc-port", "0", "--wyoming-port", "0", "--log-level", "warning")
LONG_TEXT = (
    "Good morning. The train to Boston leaves at nine. Please have your tickets ready. "
    "The dining car opens at ten. We arrive in Boston at noon. Thank you for travelling "
    "with us today."
)


@contextlib.contextmanager
def launch(tmp: Path, name: str, port: int, env: dict[str, str], *args: str) -> Iterator[None]:
    """`voxserve serve` as its own process until the module is done."""
    log = tmp / f"{name}.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voxserve", "serve", "--port", str(port), *QUIET, *args],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=clean_env(VOXSERVE_CACHE__ENABLED="false", **env),
        )
    try:
        wait_ready(proc, port, log, timeout_s=120)
        yield
    finally:
        stop_process(proc, timeout_s=15)


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The remote: a stock voxserve (real default engines) that wants an API key."""
    port = free_port()
    tmp = tmp_path_factory.mktemp("remote")
    with launch(tmp, "remote", port, {}, "--api-key", REMOTE_KEY):
        yield f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def front(remote: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The front: voxserve whose ASR and TTS are the remote's, configured by env JSON."""
    options = {"base_url": remote, "api_key": REMOTE_KEY}
    env = {
        "VOXSERVE_ENGINES__ASR": json.dumps({"name": "openai", "options": options}),
        "VOXSERVE_ENGINES__TTS": json.dumps(
            [{"name": "openai", "options": {**options, "voices": {"amy": {"voice": "joe"}}}}]
        ),
        "VOXSERVE_ENGINES__DEFAULT_VOICE": "amy",
    }
    port = free_port()
    tmp = tmp_path_factory.mktemp("front")
    with launch(tmp, "front", port, env):
        base = f"http://127.0.0.1:{port}"
        # Ready, but a server's first synthesis (its fallback phrase) can count as late
        # on a busy host (the stock server too: a stalled event loop at start), and
        # admission then sheds for a moment with 503 + Retry-After: what the SDK retries.
        with openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=5) as client:
            wav = write_wav(fixture_audio("command.wav"), SAMPLE_RATE)
            client.audio.transcriptions.create(model="whisper-1", file=("w.wav", wav))
        yield base


@pytest.fixture(scope="module")
def sdk(front: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=front + "/v1", api_key="x", max_retries=0, timeout=60) as client:
        yield client


def test_sdk_transcription_through_the_front(sdk: openai.OpenAI) -> None:
    wav = write_wav(fixture_audio("weather.wav"), SAMPLE_RATE)
    plain = sdk.audio.transcriptions.create(model="whisper-1", file=("w.wav", wav))
    assert wer(fixture_texts()["weather.wav"], plain.text) <= 0.2, plain.text
    verbose = sdk.audio.transcriptions.create(
        model="whisper-1", file=("w.wav", wav), response_format="verbose_json"
    )
    assert verbose.segments and verbose.segments[-1].end > 1.0
    assert wer(fixture_texts()["weather.wav"], verbose.text) <= 0.2


def test_sdk_speech_streams_the_remote_audio_and_it_says_the_text(sdk: openai.OpenAI) -> None:
    """The front's voice `amy` is the remote's `joe`; its audio, sent back through the front
    for transcription, says the text (not just any sound)."""
    chunks: list[bytes] = []
    with sdk.audio.speech.with_streaming_response.create(
        model="tts-1", voice="amy", input=LONG_TEXT, response_format="pcm"
    ) as response:
        assert response.headers["X-Voxserve-Voice"] == "amy"
        chunks.extend(response.iter_bytes())
    pcm = np.frombuffer(b"".join(chunks), dtype="<i2")
    assert len(chunks) >= 2  # streamed, not one body at the end
    assert pcm.size / 24_000 > 5.0 and np.abs(pcm).max() > 1000
    heard = sdk.audio.transcriptions.create(
        model="whisper-1",
        file=("s.wav", write_wav(resample(pcm, 24_000, SAMPLE_RATE), SAMPLE_RATE)),
    )
    assert wer(LONG_TEXT, heard.text) <= 0.25, heard.text


def test_the_engine_yields_audio_while_the_remote_is_still_speaking(remote: str) -> None:
    """Each chunk is handed on as it arrives: the first comes long before the remote's
    last (the remote synthesises the six sentences one after another)."""
    tts = OpenAITts(base_url=remote, api_key=REMOTE_KEY, voices={"amy": "joe"})
    try:
        started = time.monotonic()
        arrivals = [time.monotonic() - started for _ in tts.synthesize(LONG_TEXT, voice="amy")]
    finally:
        tts.close()
    assert len(arrivals) >= 3, arrivals
    assert arrivals[0] < arrivals[-1] / 2, arrivals


async def test_a_stream_session_through_the_front_hears_and_answers(front: str) -> None:
    """/v1/stream in assistant mode: VAD and turns in the front, recognition and the
    reply's voice from the remote."""
    question = np.concatenate([fixture_audio("command.wav"), silence(0.8)])
    async with connect(front.replace("http", "ws") + "/v1/stream") as ws:
        started = await start(ws, mode="assistant", output_sample_rate=24_000)
        assert started["voice"] == "amy"
        await send_audio(ws, question, speedup=2.0)
        events, audio = await collect(ws, until="tts.end", limit_s=60)
        await ws.send(json.dumps({"type": "session.end"}))
        await collect(ws, limit_s=30)
    final = of_type(events, "transcript.final")[0]
    assert wer("what time is it", final["text"]) <= 0.25, final
    pcm = np.frombuffer(b"".join(audio), dtype="<i2")
    assert pcm.size / 24_000 > 0.5 and np.abs(pcm).max() > 1000


@pytest.fixture(scope="module")
def failing(remote: str) -> Iterator[LiveServer]:
    """A front whose voices go wrong: `badkey` sends the wrong key, `down` a port nobody
    listens on; `amy` is right. Its ASR has the wrong key."""
    closed = f"http://127.0.0.1:{free_port()}/v1"
    settings = load_settings(
        port=free_port(),
        log_level="warning",
        cache=CacheConfig(enabled=False),
        # Nothing synthesised at start (see `front`).
        tts=TtsConfig(degrade=DegradeConfig(fallback_text=None)),
    )
    tts = [
        OpenAITts(base_url=remote, api_key=REMOTE_KEY, voices={"amy": "joe"}),
        OpenAITts(base_url=remote, api_key="wrong", voices={"badkey": "joe"}),
        OpenAITts(base_url=closed, voices={"down": "joe"}, timeout_s=5),
    ]
    asr = OpenAIAsr(base_url=remote, api_key="wrong")
    engines = Engines(FakeVad(), asr, tts, EchoResponder(), "amy")
    live = start_server(settings, Runtime.from_engines(settings, engines))
    yield live
    stop_server(live)


def error_of(call: Callable[[], object]) -> tuple[int, dict[str, str]]:
    """The HTTP status and OpenAI-style error fields of a call the SDK raised for."""
    with pytest.raises(openai.APIStatusError) as raised:
        call()
    body = raised.value.body
    assert isinstance(body, dict), body
    return raised.value.status_code, body.get("error", body)


def test_remote_failures_are_clear_errors_and_fail_alone(failing: LiveServer) -> None:
    with openai.OpenAI(base_url=failing.http_url + "/v1", api_key="x", max_retries=0) as client:

        def speak(voice: str) -> bytes:
            return client.audio.speech.create(
                model="tts-1", voice=voice, input="Hello there.", response_format="pcm"
            ).content

        with ThreadPoolExecutor(4) as pool:  # the failing calls beside a good one
            bad = pool.submit(error_of, lambda: speak("badkey"))
            down = pool.submit(error_of, lambda: speak("down"))
            good = pool.submit(speak, "amy")
            refused, unreachable, audio = bad.result(), down.result(), good.result()
        assert refused[0] == 502 and refused[1]["code"] == ErrorCode.ENGINE_ERROR.value
        assert "HTTP 401" in refused[1]["message"] and "api_key" in refused[1]["message"]
        assert (
            unreachable[0] == 503 and unreachable[1]["code"] == ErrorCode.ENGINE_UNAVAILABLE.value
        )
        assert "cannot connect" in unreachable[1]["message"]
        assert np.abs(np.frombuffer(audio, dtype="<i2")).max() > 1000  # the good voice still speaks
        wav = write_wav(fixture_audio("command.wav"), SAMPLE_RATE)
        asr_refused = error_of(
            lambda: client.audio.transcriptions.create(model="whisper-1", file=("c.wav", wav))
        )
        assert asr_refused[0] == 502 and "api_key" in asr_refused[1]["message"]


def test_a_remote_that_is_down_is_engine_unavailable_at_once() -> None:
    asr = OpenAIAsr(base_url=f"http://127.0.0.1:{free_port()}/v1", timeout_s=5)
    try:
        with pytest.raises(VoxError) as raised:
            asr.transcribe(np.zeros(16_000, dtype=np.float32))
    finally:
        asr.close()
    assert raised.value.code is ErrorCode.ENGINE_UNAVAILABLE and raised.value.stage == "asr"

"""The cosyvoice engine against stand-ins of CosyVoice's gRPC and FastAPI runtimes
(voxserve/standins/cosyvoice.py: built from the published protocol, tones, no model),
over real sockets: each request kind carries its fields, audio streams as it comes, and a
runtime that is down, dies mid-stream or stalls fails that call with a clear error in time
while other calls go on and the next call works. CosyVoice itself (weights, a GPU) is not
run here: the in-process path is checked only for its option errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import free_port
from voxserve.engines import cosyvoice_local
from voxserve.engines.base import VoiceRegistration
from voxserve.engines.cosyvoice_tts import CosyVoiceTts
from voxserve.engines.registry import EngineConfigError
from voxserve.errors import ErrorCode, VoxError
from voxserve.standins.cosyvoice import GrpcStandin, HttpStandin, Standin, sft_client

TIMEOUT_S = 1.0
VOICES = {
    "woman": "中文女",
    "calm": {"spk_id": "中文男", "instruct": "Speak calmly.", "language": "zh"},
}
CHUNK = 2400  # samples of one stand-in chunk (0.1 s at 24 kHz)
PROMPT = (np.sin(np.arange(8000) / 5.0) * 8000).astype(np.int16)  # 0.5 s at 16 kHz


@pytest.fixture(scope="module")
def grpc_standin() -> Iterator[GrpcStandin]:
    standin = GrpcStandin().start()
    yield standin
    standin.stop()


@pytest.fixture(scope="module")
def http_standin() -> Iterator[HttpStandin]:
    standin = HttpStandin().start()
    yield standin
    standin.stop()


@pytest.fixture(params=["grpc", "http"])
def standin(
    request: pytest.FixtureRequest, grpc_standin: GrpcStandin, http_standin: HttpStandin
) -> Iterator[Standin]:
    chosen: Standin = grpc_standin if request.param == "grpc" else http_standin
    chosen.release.clear()
    yield chosen
    chosen.release.set()  # frees a call a failed test left waiting


def url_of(standin: Standin) -> str:
    scheme = "grpc" if isinstance(standin, GrpcStandin) else "http"
    return f"{scheme}://127.0.0.1:{standin.port}"


def engine(standin: Standin, tmp_path: Path, **options: object) -> CosyVoiceTts:
    return CosyVoiceTts(
        url=url_of(standin),
        voices=VOICES,
        voice_dir=str(tmp_path / "voices"),
        timeout_s=TIMEOUT_S,
        **options,  # type: ignore[arg-type]
    )


def speak(tts: CosyVoiceTts, text: str, voice: str = "woman") -> np.ndarray:
    return np.concatenate(list(tts.synthesize(text, voice=voice)))


def test_each_request_kind_carries_its_fields(standin: Standin, tmp_path: Path) -> None:
    tts = engine(standin, tmp_path)
    tts.register_voice("clone", PROMPT, "希望你以后能够做的比我还好呦。", "zh")
    tts.register_voice("abroad", PROMPT, "", "en")
    assert {v.id for v in tts.voices()} == {"woman", "calm", "clone", "abroad"}
    expected = {
        "woman": {"kind": "sft_request", "spk_id": "中文女"},
        "calm": {"kind": "instruct_request", "spk_id": "中文男", "instruct_text": "Speak calmly."},
        "clone": {"kind": "zero_shot_request", "prompt_text": "希望你以后能够做的比我还好呦。"},
        "abroad": {"kind": "cross_lingual_request"},
    }
    for voice, fields in expected.items():
        audio = speak(tts, "你好，世界。", voice)
        assert audio.size == 3 * CHUNK and np.abs(audio).max() > 5000  # the tone, whole
        got = standin.requests[-1]
        assert got["tts_text"] == "你好，世界。"
        assert {k: got.get(k) for k in fields} == fields
        if voice in ("clone", "abroad"):
            assert got["prompt_audio"] == PROMPT.tobytes()  # 16 kHz int16, as CosyVoice reads
    tts.close()


def test_the_benchs_direct_client_gets_the_standins_chunks(grpc_standin: GrpcStandin) -> None:
    """`sft_client` (what `python -m voxserve.bench.cosyvoice_relay` times directly) sends an
    sft request and reads every chunk of its reply."""
    chunks = list(sft_client(f"127.0.0.1:{grpc_standin.port}")("Direct call."))
    assert [len(c) for c in chunks] == [CHUNK * 2] * grpc_standin.chunks
    assert grpc_standin.requests[-1] == {
        "kind": "sft_request",
        "tts_text": "Direct call.",
        "spk_id": "中文女",
    }


def test_text_goes_one_sentence_per_call_and_chunks_as_they_come(
    standin: Standin, tmp_path: Path
) -> None:
    tts = engine(standin, tmp_path)
    before = len(standin.requests)
    chunks = tts.synthesize("First one is gated. Second one.", voice="woman")
    first = next(chunks)  # the stand-in holds its second chunk until released
    assert first.size == CHUNK and len(standin.requests) == before + 1
    standin.release.set()
    rest = list(chunks)
    assert sum(c.size for c in rest) == 5 * CHUNK
    texts = [r["tts_text"] for r in standin.requests[before:]]
    assert texts == ["First one is gated.", "Second one."]
    tts.close()


def test_death_mid_stream_is_a_clear_error_and_the_next_call_works(
    standin: Standin, tmp_path: Path
) -> None:
    tts = engine(standin, tmp_path)
    chunks = tts.synthesize("This one dies.", voice="woman")
    assert next(chunks).size == CHUNK
    with pytest.raises(VoxError) as failed:
        next(chunks)
    assert failed.value.code is ErrorCode.ENGINE_ERROR and failed.value.stage == "tts"
    assert "cosyvoice runtime" in failed.value.message and url_of(standin) in failed.value.message
    if isinstance(standin, GrpcStandin):  # the runtime process died: it comes back
        with pytest.raises(VoxError) as down:
            speak(tts, "Nobody is there.")
        assert "unreachable" in down.value.message
        standin.start()
    assert speak(tts, "Back again.").size == 3 * CHUNK
    assert tts.credits.in_flight == 0
    tts.close()


def test_a_model_failure_before_audio_says_why(standin: Standin, tmp_path: Path) -> None:
    tts = engine(standin, tmp_path)
    with pytest.raises(VoxError) as failed:
        speak(tts, "This one fails.")
    assert failed.value.code is ErrorCode.ENGINE_ERROR
    message = failed.value.message
    assert "before any audio" in message and "spk_id '中文女' is a speaker" in message
    if isinstance(standin, GrpcStandin):  # the runtime's own reason travels in the details
        assert "UNKNOWN before any audio: Exception iterating responses" in message
    assert speak(tts, "Next one.").size == 3 * CHUNK and tts.credits.in_flight == 0
    tts.close()


def test_a_stall_times_out_while_other_calls_go_on(standin: Standin, tmp_path: Path) -> None:
    tts = engine(standin, tmp_path)
    outcome: list[BaseException] = []
    took: list[float] = []

    def stalled() -> None:
        started = time.monotonic()
        try:
            speak(tts, "This one stalls.")
        except VoxError as exc:
            outcome.append(exc)
        took.append(time.monotonic() - started)

    worker = threading.Thread(target=stalled)
    worker.start()
    assert speak(tts, "Meanwhile this one speaks.").size == 3 * CHUNK
    worker.join(10)
    assert outcome and isinstance(outcome[0], VoxError)
    assert outcome[0].code is ErrorCode.STAGE_TIMEOUT
    assert f"sent no audio for {TIMEOUT_S:g} s" in outcome[0].message
    assert took[0] < TIMEOUT_S + 3  # the deadline, not the stand-in's 30 s
    assert tts.credits.misses == 1 and tts.credits.in_flight == 0
    tts.close()


def test_the_credit_window_refuses_past_max_concurrency(standin: Standin, tmp_path: Path) -> None:
    tts = engine(standin, tmp_path, max_concurrency=1, credit_wait_ms=0)
    held = tts.synthesize("This one is gated.", voice="woman")
    next(held)  # one call in flight, holding the only credit
    with pytest.raises(VoxError) as refused:
        speak(tts, "No room for this one.")
    assert refused.value.code is ErrorCode.OVERLOADED and refused.value.retry_after_s == 1
    standin.release.set()
    assert sum(c.size for c in held) == 2 * CHUNK
    assert speak(tts, "Room again.").size == 3 * CHUNK
    tts.close()


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_a_runtime_that_is_down_fails_at_once(scheme: str, tmp_path: Path) -> None:
    tts = CosyVoiceTts(
        url=f"{scheme}://127.0.0.1:{free_port()}", voices=VOICES, voice_dir=str(tmp_path)
    )
    with pytest.raises(VoxError) as down:
        speak(tts, "Anyone there?")
    assert down.value.code is ErrorCode.ENGINE_ERROR and "unreachable" in down.value.message
    tts.close()


def test_zero_shot_voices_stay_on_disk(standin: Standin, tmp_path: Path) -> None:
    tts = engine(standin, tmp_path)
    tts.register_voice("clone", PROMPT, "Hello there.", "en", "my clone")
    tts.register_voice("gone", PROMPT, "", "en")
    assert tts.unregister_voice("gone") and not tts.unregister_voice("gone")
    tts.close()
    again = engine(standin, tmp_path)
    clone = {v.id: v for v in again.voices()}["clone"]
    assert (clone.language, clone.description, clone.sample_rate) == ("en", "my clone", 24_000)
    assert "gone" not in {v.id for v in again.voices()}
    # the capability the admin routes call: the registered voices only, not the table's
    assert isinstance(again, VoiceRegistration)
    assert [v.id for v in again.registered_voices()] == ["clone"]
    assert again.prompt_rules.rate == 16_000  # what CosyVoice reads a prompt at
    speak(again, "Still me.", "clone")
    assert standin.requests[-1]["prompt_text"] == "Hello there."
    with pytest.raises(ValueError, match="voices table"):
        again.register_voice("woman", PROMPT, "", "zh")
    again.close()


def test_a_bad_voice_file_skips_that_voice_not_the_engine(
    grpc_standin: GrpcStandin, tmp_path: Path
) -> None:
    """An empty WAV, a WAV that is not one, a JSON that is not an object: each voice is
    skipped at start (logged); the good one loads and the engine serves."""
    tts = engine(grpc_standin, tmp_path)
    tts.register_voice("good", PROMPT, "Hello there.", "en")
    tts.close()
    voices = tmp_path / "voices"
    for name, wav, meta in (
        ("empty", b"", b"{}"),
        ("garbled", b"RIFF garbage", b"{}"),
        ("listed", (voices / "good.wav").read_bytes(), b"[]"),
        ("broken", (voices / "good.wav").read_bytes(), b"{"),
    ):
        (voices / f"{name}.wav").write_bytes(wav)
        (voices / f"{name}.json").write_bytes(meta)
    again = engine(grpc_standin, tmp_path)
    assert {v.id for v in again.voices()} == {"woman", "calm", "good"}
    speak(again, "Still me.", "good")
    again.close()


def test_registrations_at_once_keep_every_voice_and_no_half_file(
    grpc_standin: GrpcStandin, tmp_path: Path
) -> None:
    """Admin calls run on executor threads: the same id and different ids registered at
    once neither fail on each other's temporary file nor lose a voice."""
    tts = engine(grpc_standin, tmp_path)
    errors: list[BaseException] = []

    def register(i: int) -> None:
        try:
            for round_ in range(15):
                tts.register_voice("shared", PROMPT, f"take {round_}", "en")
                tts.register_voice(f"own{i}", PROMPT, "", "en")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    ids = {v.id for v in tts.voices()}
    assert {"shared", "own0", "own1", "own2", "own3"} <= ids
    assert not list((tmp_path / "voices").glob(".*.tmp"))
    tts.close()
    assert {"shared", "own0", "own3"} <= {v.id for v in engine(grpc_standin, tmp_path).voices()}


def test_option_errors_name_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(**options: object) -> str:
        with pytest.raises(EngineConfigError) as error:
            CosyVoiceTts(voice_dir=str(tmp_path), **options)  # type: ignore[arg-type]
        assert str(error.value).startswith("tts engine 'cosyvoice': ")
        return str(error.value)

    assert "grpc://HOST:PORT" in refused(url="ftp://host:1")
    assert "needs a port" in refused(url="grpc://host")
    assert "unknown key 'speed'; valid: spk_id, language" in refused(
        url="grpc://h:1", voices={"a": {"spk_id": "x", "speed": 2}}
    )
    assert "sample_rate 1000" in refused(url="http://h:1", sample_rate=1000)
    assert "timeout_s" in refused(url="http://h:1", timeout_s=0)
    # JSON and TOML values of the wrong type: one line, not a TypeError traceback
    assert "timeout_s must be a number, got 'abc'" in refused(url="grpc://h:1", timeout_s="abc")
    assert "sample_rate must be an integer, got '24000'" in refused(
        url="grpc://h:1", sample_rate="24000"
    )
    assert "max_concurrency must be an integer, got True" in refused(
        url="grpc://h:1", max_concurrency=True
    )
    assert "url must be a string" in refused(url=["grpc://h:1"])
    monkeypatch.setattr(cosyvoice_local, "available", lambda: False)
    message = refused()
    assert "set url" in message and "cosyvoice package, which is not installed" in message
    monkeypatch.setattr(cosyvoice_local, "available", lambda: True)
    assert "needs model_dir" in refused()


def test_the_runtimes_take_no_speed(tmp_path: Path) -> None:
    tts = CosyVoiceTts(url="http://127.0.0.1:9", voices=VOICES, voice_dir=str(tmp_path))
    with pytest.raises(ValueError, match="take no speed"):
        tts.synthesize("Hi.", voice="woman", speed=1.5)
    with pytest.raises(ValueError, match="unknown cosyvoice voice"):
        tts.synthesize("Hi.", voice="nobody")
    tts.close()

"""The gRPC transport's plumbing over a real socket with fake engines: multi-frame audio,
idempotent frames, text sessions, marks, bad input and its status codes, overload refusal,
cancellation, health and reflection."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.conftest import LiveServer, stop_server
from tests.fakes import FakeVad, silence, tone
from tests.transports.conftest import start_fake_server
from tests.transports.grpc_client import audio_requests, collect, error_code, of_kind, stub
from voxserve.v1 import voxserve_pb2 as pb


def two_tones(f1: float, f2: float) -> np.ndarray:
    return np.concatenate([silence(0.3), tone(f1, 1.0), silence(0.8), tone(f2, 1.0), silence(0.8)])


@pytest.mark.parametrize("frames_per_message", [1, 5, 10])
async def test_recognize_multi_frame_messages(
    fake_server: LiveServer, frames_per_message: int
) -> None:
    audio = two_tones(440, 880)
    async with grpc.aio.insecure_channel(fake_server.grpc_target) as channel:
        requests = audio_requests(
            pb.RecognizeRequest,
            pb.RecognitionConfig(trace_id="grpc-test"),
            audio,
            frames_per_message=frames_per_message,
            speedup=4.0,  # partials come under asr.partial_max_speed (8x)
        )
        responses = await collect(stub(channel).Recognize(requests))
    started = responses[0][1]
    assert responses[0][0] == "started" and started.mode == pb.MODE_ASR
    assert started.trace_id == "grpc-test" and started.frame_ms == 20
    transcripts = of_kind(responses, "transcript")
    finals = [t for t in transcripts if t.is_final]
    assert [(f.segment, f.text) for f in finals] == [(0, "tone440"), (1, "tone880")]
    assert abs(finals[0].start_ms - 300) <= 70 and abs(finals[0].end_ms - 1300) <= 70
    assert any(not t.is_final and t.segment == 0 for t in transcripts)
    assert len(of_kind(responses, "vad_start")) == 2 and len(of_kind(responses, "vad_end")) == 2
    ended = responses[-1][1]
    frames = -(-audio.size // 320)  # counters count 20 ms frames, whatever the message size
    assert responses[-1][0] == "ended"
    assert ended.received == frames and ended.processed == frames and ended.gaps == 0


async def test_resent_message_is_processed_once_frame_by_frame(fake_server: LiveServer) -> None:
    audio = two_tones(500, 700)

    async def requests() -> Any:
        yield pb.RecognizeRequest(config=pb.RecognitionConfig())
        step = 320 * 4
        for n, i in enumerate(range(0, audio.size, step)):
            message = pb.RecognizeRequest(
                audio=pb.AudioFrames(seq_id=n * 4, pcm=audio[i : i + step].tobytes())
            )
            yield message
            yield message  # a retransmit: all four frames are duplicates
            if n % 5 == 0:
                await asyncio.sleep(0.01)

    async with grpc.aio.insecure_channel(fake_server.grpc_target) as channel:
        responses = await collect(stub(channel).Recognize(requests()))
    ended = responses[-1][1]
    frames = -(-audio.size // 320)
    assert ended.received == 2 * frames and ended.duplicates == frames
    assert ended.processed == frames and ended.gaps == 0
    finals = [t.text for t in of_kind(responses, "transcript") if t.is_final]
    assert finals == ["tone500", "tone700"]


async def test_converse_tts_mode_streams_text_and_echoes_marks(fake_server: LiveServer) -> None:
    async def requests() -> Any:
        yield pb.ConverseRequest(config=pb.StreamConfig(mode=pb.MODE_TTS))
        yield pb.ConverseRequest(text=pb.TextInput(text="One two. Three"))
        yield pb.ConverseRequest(mark=pb.Mark(id="after-text"))
        yield pb.ConverseRequest(text=pb.TextInput(text=" four five.", flush=True))
        yield pb.ConverseRequest(end=pb.EndInput())

    async with grpc.aio.insecure_channel(fake_server.grpc_target) as channel:
        responses = await collect(stub(channel).Converse(requests()))
    kinds = [k for k, _ in responses]
    assert kinds[0] == "started" and kinds[-1] == "ended"
    assert [m.id for m in of_kind(responses, "mark")] == ["after-text"]
    # One utterance until the flush: one reply, five words at 0.1 s each (fake TTS).
    starts, ends = of_kind(responses, "tts_start"), of_kind(responses, "tts_end")
    assert [s.reply for s in starts] == [0] and [e.interrupted for e in ends] == [False]
    audio = of_kind(responses, "audio")
    assert audio and {a.reply for a in audio} == {0}
    total_ms = sum(len(a.pcm) for a in audio) * 1000 // (2 * 16_000)
    assert total_ms == ends[0].audio_ms == 500


async def test_bad_message_mid_stream_is_an_error_message_and_the_session_goes_on(
    fake_server: LiveServer,
) -> None:
    audio = np.concatenate([silence(0.3), tone(600, 1.0), silence(0.8)])
    tail = [
        pb.ConverseRequest(audio=pb.AudioFrames(seq_id=10_000, pcm=b"\x00\x01\x02")),
        pb.ConverseRequest(audio=pb.AudioFrames(seq_id=10_001, pcm=b"")),
        pb.ConverseRequest(audio=pb.AudioFrames(seq_id=10_002, pcm=bytes(640 * 11))),
        pb.ConverseRequest(config=pb.StreamConfig()),
        pb.ConverseRequest(text=pb.TextInput(text="not in an audio session")),
        pb.ConverseRequest(),
    ]
    async with grpc.aio.insecure_channel(fake_server.grpc_target) as channel:
        requests = audio_requests(
            pb.ConverseRequest,
            pb.StreamConfig(mode=pb.MODE_ASR),
            audio,
            speedup=8.0,
            tail=tail,
        )
        responses = await collect(stub(channel).Converse(requests))
    errors = of_kind(responses, "error")
    assert [e.code for e in errors] == [
        "odd_length_pcm",
        "empty_audio",
        "frame_too_large",
        "already_started",
        "wrong_mode",
        "invalid_message",
    ]
    assert not any(e.fatal for e in errors)
    assert [t.text for t in of_kind(responses, "transcript") if t.is_final] == ["tone600"]
    ended = responses[-1][1]
    assert responses[-1][0] == "ended" and ended.rejected == 3


@pytest.mark.parametrize(
    ("config", "code"),
    [
        (pb.StreamConfig(sample_rate=12_345), "unsupported_sample_rate"),
        (pb.StreamConfig(output_sample_rate=11_025), "unsupported_sample_rate"),
        (pb.StreamConfig(encoding="mp3"), "unsupported_encoding"),
        (pb.StreamConfig(voice="alloy"), "unknown_voice"),
        (pb.StreamConfig(language="xx"), "unknown_language"),
        (pb.StreamConfig(mode=7), "unknown_mode"),  # type: ignore[arg-type]
        (pb.StreamConfig(chunk_ms=10), "invalid_parameter"),
        (pb.StreamConfig(speed=9.0), "invalid_parameter"),
        (pb.StreamConfig(trace_id="bad trace id!"), "invalid_message"),
    ],
)
async def test_bad_config_ends_the_call_with_invalid_argument(
    fake_server: LiveServer, config: pb.StreamConfig, code: str
) -> None:
    async def requests() -> Any:
        yield pb.ConverseRequest(config=config)

    async with grpc.aio.insecure_channel(fake_server.grpc_target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await collect(stub(channel).Converse(requests()))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_code(caught.value) == code


async def test_audio_before_config_is_not_started(fake_server: LiveServer) -> None:
    async def requests() -> Any:
        yield pb.RecognizeRequest(audio=pb.AudioFrames(seq_id=0, pcm=bytes(640)))

    async with grpc.aio.insecure_channel(fake_server.grpc_target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await collect(stub(channel).Recognize(requests()))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_code(caught.value) == "not_started"

        async def nothing() -> Any:
            return
            yield

        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await collect(stub(channel).Recognize(nothing()))
        assert error_code(caught.value) == "not_started"


async def test_synthesize_bad_input(fake_server: LiveServer) -> None:
    cases = [
        (pb.SynthesizeRequest(text="  "), "empty_text"),
        (pb.SynthesizeRequest(text="Hi.", voice="alloy"), "unknown_voice"),
        (pb.SynthesizeRequest(text="Hi.", sample_rate=1234), "unsupported_sample_rate"),
        (pb.SynthesizeRequest(text="Hi.", speed=5.0), "invalid_parameter"),
        (pb.SynthesizeRequest(text="x" * 5000), "text_too_long"),
    ]
    async with grpc.aio.insecure_channel(fake_server.grpc_target) as channel:
        for request, code in cases:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(stub(channel).Synthesize(request))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, code
            assert error_code(caught.value) == code


async def test_message_over_the_limit_is_refused_by_grpc(fake_server: LiveServer) -> None:
    async def requests() -> Any:
        yield pb.ConverseRequest(config=pb.StreamConfig(mode=pb.MODE_TTS))
        yield pb.ConverseRequest(text=pb.TextInput(text="x" * (300 * 1024)))

    async with grpc.aio.insecure_channel(fake_server.grpc_target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await collect(stub(channel).Converse(requests()))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_second_session_is_refused_at_once_when_full(one_session_server: LiveServer) -> None:
    runtime = one_session_server.runtime
    async with grpc.aio.insecure_channel(one_session_server.grpc_target) as channel:
        release = asyncio.Event()

        async def held() -> Any:
            yield pb.RecognizeRequest(config=pb.RecognitionConfig())
            await release.wait()

        first = stub(channel).Recognize(held())
        assert (await first.read()).WhichOneof("event") == "started"
        assert runtime.active_sessions == 1

        async def second() -> Any:
            yield pb.RecognizeRequest(config=pb.RecognitionConfig())

        began = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await collect(stub(channel).Recognize(second()))
        assert time.monotonic() - began < 1.0
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_code(caught.value) == "overloaded"
        retry_ms = str(runtime.settings.flow.retry_after_s * 1000)  # the configured hint
        assert ("voxserve-retry-after-ms", retry_ms) in tuple(caught.value.trailing_metadata())
        with pytest.raises(grpc.aio.AioRpcError) as converse:
            await collect(stub(channel).Converse(iter([pb.ConverseRequest()])))
        assert converse.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        release.set()
        kinds = []
        while (response := await first.read()) is not grpc.aio.EOF:
            kinds.append(response.WhichOneof("event"))
        assert kinds[-1] == "ended"
    assert runtime.active_sessions == 0


async def test_cancelled_call_frees_its_session(fake_server: LiveServer) -> None:
    runtime = fake_server.runtime

    async def forever() -> Any:
        yield pb.ConverseRequest(config=pb.StreamConfig(mode=pb.MODE_ASR))
        for seq in range(10_000):
            yield pb.ConverseRequest(audio=pb.AudioFrames(seq_id=seq, pcm=bytes(640)))
            await asyncio.sleep(0.02)

    async with grpc.aio.insecure_channel(fake_server.grpc_target) as channel:
        call = stub(channel).Converse(forever())
        assert (await call.read()).WhichOneof("event") == "started"
        assert runtime.active_sessions == 1
        call.cancel()
    deadline = time.monotonic() + 5
    while runtime.active_sessions and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    assert runtime.active_sessions == 0


async def test_health_and_reflection(fake_server: LiveServer) -> None:
    async with grpc.aio.insecure_channel(fake_server.grpc_target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "voxserve.v1.Voxserve"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        async for answer in reflection.ServerReflectionInfo(iter([ask])):
            names = {s.name for s in answer.list_services_response.service}
        assert {"voxserve.v1.Voxserve", "grpc.health.v1.Health"} <= names

        ask = reflection_pb2.ServerReflectionRequest(file_containing_symbol="voxserve.v1.Voxserve")
        async for answer in reflection.ServerReflectionInfo(iter([ask])):
            assert answer.file_descriptor_response.file_descriptor_proto


async def test_listing(fake_server: LiveServer) -> None:
    async with grpc.aio.insecure_channel(fake_server.grpc_target) as channel:
        voices = await stub(channel).ListVoices(pb.ListVoicesRequest())
        engines = await stub(channel).ListEngines(pb.ListEnginesRequest())
    assert [v.id for v in voices.voices] == ["fake"] and voices.default_voice == "fake"
    kinds = {e.kind: e for e in engines.engines}
    assert set(kinds) == {"vad", "asr", "tts", "responder"}
    assert list(kinds["asr"].languages) == ["en"]
    assert "tts-1" in engines.models and "whisper-1" in engines.models


class BrokenVad(FakeVad):
    """Fails on its fifth call: the session cannot go on (VAD is not optional)."""

    def speech_probs(self, state: Any, audio: np.ndarray) -> np.ndarray:
        if self.calls >= 4:
            raise RuntimeError("the VAD model broke")
        return super().speech_probs(state, audio)


async def test_fatal_pipeline_error_ends_the_call_after_ended() -> None:
    live = start_fake_server({"vad": BrokenVad()})
    try:
        audio = np.concatenate([silence(0.3), tone(440, 1.0), silence(0.8)])
        async with grpc.aio.insecure_channel(live.grpc_target) as channel:
            requests = audio_requests(
                pb.RecognizeRequest, pb.RecognitionConfig(), audio, speedup=8.0
            )
            call = stub(channel).Recognize(requests)
            kinds = []
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for response in call:
                    kinds.append(response.WhichOneof("event"))
        assert kinds[0] == "started" and kinds[-1] == "ended"
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_code(caught.value) == "engine_error"
        metadata = dict(caught.value.trailing_metadata())
        assert metadata["voxserve-trace-id"]
        # The server releases the slot as the call's handler returns, just after the status.
        for _ in range(100):
            if live.runtime.active_sessions == 0:
                break
            await asyncio.sleep(0.02)
        assert live.runtime.active_sessions == 0
    finally:
        stop_server(live)


async def test_a_client_writing_on_after_a_fatal_error_gets_the_status_after_its_half_close() -> (
    None
):
    """The session fails while the client streams on: `ended` comes at once, and the
    status only after the client's half-close, which it sends 0.5 s of paced writes
    later. What it checks: no write of the client's can race the status (grpc's client
    reports that race as INTERNAL, as a loaded CI machine saw), not a timing bound."""
    live = start_fake_server({"vad": BrokenVad()})
    try:
        async with grpc.aio.insecure_channel(live.grpc_target) as channel:
            call = stub(channel).Recognize(timeout=10)
            await call.write(pb.RecognizeRequest(config=pb.RecognitionConfig()))
            ended = asyncio.Event()

            async def write_on() -> float:
                seq = 0
                while not ended.is_set():  # real-time pace until `ended` comes
                    await call.write(
                        pb.RecognizeRequest(audio=pb.AudioFrames(seq_id=seq, pcm=bytes(640)))
                    )
                    seq += 1
                    await asyncio.sleep(0.02)
                for _ in range(25):  # and 0.5 s more, as a client that reacts late
                    await call.write(
                        pb.RecognizeRequest(audio=pb.AudioFrames(seq_id=seq, pcm=bytes(640)))
                    )
                    seq += 1
                    await asyncio.sleep(0.02)
                await call.done_writing()
                return time.monotonic()

            writer = asyncio.create_task(write_on())
            kinds = []
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async with asyncio.timeout(8):
                    async for response in call:
                        kinds.append(response.WhichOneof("event"))
                        if kinds[-1] == "ended":
                            ended.set()
            status_at = time.monotonic()
            half_closed_at = await writer
            assert kinds[0] == "started" and kinds[-1] == "ended"
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert half_closed_at <= status_at
    finally:
        stop_server(live)

"""grpc_codec without a server: configs validate exactly like the WebSocket's session.start,
frames split with their ids, every event maps, every error code has a status, and random
bytes never raise anything but VoxError."""

from __future__ import annotations

import random
from typing import Any

import grpc
import msgspec
import pytest
from google.protobuf.message import DecodeError

from tests.event_samples import SAMPLES
from voxserve import events as ev
from voxserve.errors import ErrorCode, VoxError
from voxserve.events import CancelMessage, EndMessage, MarkMessage, TextMessage, TurnDetection
from voxserve.server.grpc import codec
from voxserve.server.grpc import events as grpc_events
from voxserve.server.session.stream_protocol import parse_start
from voxserve.v1 import voxserve_pb2 as pb


def test_every_error_code_has_a_deliberate_status() -> None:
    for code in ErrorCode:
        assert codec.status_for(code) != grpc.StatusCode.UNKNOWN, code
    assert codec.status_for(ErrorCode.OVERLOADED) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert codec.status_for(ErrorCode.NOT_READY) == grpc.StatusCode.UNAVAILABLE
    assert codec.status_for(ErrorCode.UNSUPPORTED_SAMPLE_RATE) == grpc.StatusCode.INVALID_ARGUMENT
    assert codec.status_for(ErrorCode.STAGE_TIMEOUT) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert codec.status_for(ErrorCode.ENGINE_ERROR) == grpc.StatusCode.UNAVAILABLE
    assert codec.status_for(ErrorCode.INTERNAL) == grpc.StatusCode.INTERNAL


def test_trailing_metadata() -> None:
    error = VoxError(ErrorCode.OVERLOADED, "full", fatal=True)
    assert codec.trailing_metadata(error, "t-1") == (
        ("voxserve-error-code", "overloaded"),
        ("voxserve-trace-id", "t-1"),
        ("voxserve-retry-after-ms", "1000"),
    )
    assert codec.trailing_metadata(VoxError(ErrorCode.EMPTY_TEXT, "")) == (
        ("voxserve-error-code", "empty_text"),
    )


def test_defaults_are_the_websockets() -> None:
    config = codec.stream_config(pb.StreamConfig(trace_id="t"))
    assert config == parse_start({"mode": "assistant", "trace_id": "t"})
    asr = codec.recognition_config(pb.RecognitionConfig(trace_id="t"))
    assert asr == parse_start({"mode": "asr", "trace_id": "t"})


def test_set_fields_pass_through() -> None:
    message = pb.StreamConfig(
        mode=pb.MODE_TTS,
        sample_rate=48_000,
        encoding="pcm16",
        language="en",
        voice="joe",
        output_sample_rate=24_000,
        speed=1.5,
        partials=False,
        chunk_ms=320,
        trace_id="call-1",
    )
    config = codec.stream_config(message)
    assert (config.mode, config.sample_rate, config.encoding) == ("tts", 48_000, "pcm_s16le")
    assert (config.voice, config.output_sample_rate, config.speed) == ("joe", 24_000, 1.5)
    assert (config.partials, config.chunk_ms, config.trace_id) == (False, 320, "call-1")
    assert codec.recognition_config(pb.RecognitionConfig(partials=True)).partials is True
    assert codec.recognition_config(pb.RecognitionConfig()).partials is None


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (pb.StreamConfig(sample_rate=44_100), ErrorCode.UNSUPPORTED_SAMPLE_RATE),
        (pb.StreamConfig(encoding="opus"), ErrorCode.UNSUPPORTED_ENCODING),
        (pb.StreamConfig(chunk_ms=5_000), ErrorCode.INVALID_PARAMETER),
        (pb.StreamConfig(speed=0.1), ErrorCode.INVALID_PARAMETER),
        (pb.StreamConfig(mode=9), ErrorCode.UNKNOWN_MODE),  # type: ignore[arg-type]
        (pb.StreamConfig(trace_id="x" * 65), ErrorCode.INVALID_MESSAGE),
    ],
)
def test_bad_configs_are_fatal_with_the_websockets_codes(
    message: pb.StreamConfig, code: ErrorCode
) -> None:
    with pytest.raises(VoxError) as caught:
        codec.stream_config(message)
    assert caught.value.code == code and caught.value.fatal


def test_converse_inputs() -> None:
    def parse(**fields: Any) -> Any:
        return codec.converse_input(pb.ConverseRequest(**fields))

    assert parse(text=pb.TextInput(text="hi", flush=True)) == TextMessage("hi", True)
    assert isinstance(parse(end=pb.EndInput()), EndMessage)
    assert isinstance(parse(cancel=pb.Cancel()), CancelMessage)
    assert parse(mark=pb.Mark(id="m")) == MarkMessage("m")
    audio = pb.AudioFrames(seq_id=3, pcm=b"\0\0")
    assert parse(audio=audio) == audio
    for fields, code in [
        ({"mark": pb.Mark(id="x" * 65)}, ErrorCode.INVALID_MESSAGE),
        ({"config": pb.StreamConfig()}, ErrorCode.ALREADY_STARTED),
        ({}, ErrorCode.INVALID_MESSAGE),
    ]:
        with pytest.raises(VoxError) as caught:
            parse(**fields)
        assert caught.value.code == code and not caught.value.fatal


def test_split_frames() -> None:
    pcm = bytes(range(256)) * 10  # 2560 bytes = 4 frames at 16 kHz
    frames = codec.split_frames(pb.AudioFrames(seq_id=7, pcm=pcm), 16_000, 200)
    assert [seq for seq, _ in frames] == [7, 8, 9, 10]
    assert b"".join(bytes(view) for _, view in frames) == pcm
    short = codec.split_frames(pb.AudioFrames(seq_id=0, pcm=bytes(700)), 16_000, 200)
    assert [len(view) for _, view in short] == [640, 60]
    wrap = codec.split_frames(pb.AudioFrames(seq_id=2**32 - 1, pcm=bytes(1280)), 16_000, 200)
    assert [seq for seq, _ in wrap] == [2**32 - 1, 0]
    assert len(codec.split_frames(pb.AudioFrames(pcm=bytes(882)), 22_050, 200)) == 1
    for pcm_bad, code in [
        (b"", ErrorCode.EMPTY_AUDIO),
        (b"\0\0\0", ErrorCode.ODD_LENGTH_PCM),
        (bytes(6402), ErrorCode.FRAME_TOO_LARGE),
    ]:
        with pytest.raises(VoxError) as caught:
            codec.split_frames(pb.AudioFrames(pcm=pcm_bad), 16_000, 200)
        assert caught.value.code == code


def test_every_event_type_maps() -> None:
    first = {type(e): e for e, _ in reversed(SAMPLES)}  # the first sample of each type
    kinds = (ev.SessionStarted, ev.VadStart, ev.VadEnd, ev.TranscriptPartial, ev.TranscriptFinal)
    kinds += (ev.ResponseDelta, ev.ResponseText, ev.TtsStart, ev.TtsEnd, ev.BargeIn, ev.Mark)
    events: list[ev.ServerEvent] = [
        *(first[kind] for kind in kinds),
        # an error about a reply, not a segment (SAMPLES' errors have both or neither)
        ev.ErrorEvent(code="engine_error", message="m", fatal=False, stage="tts", reply=1),
        first[ev.SessionEnded],
    ]
    fields = []
    for event in events:
        response = grpc_events.encode_event(event, pb.ConverseResponse)
        assert response is not None, event
        fields.append(response.WhichOneof("event"))
    assert len(set(fields)) == len(fields) - 1  # partial and final share `transcript`
    final = grpc_events.encode_event(events[4], pb.ConverseResponse)
    assert final is not None and final.transcript.is_final and final.transcript.segment == 1
    error = grpc_events.encode_event(events[11], pb.ConverseResponse)
    assert (
        error is not None and error.error.HasField("reply") and not error.error.HasField("segment")
    )
    assert grpc_events.encode_event(events[5], pb.RecognizeResponse) is None  # no replies in asr
    # Typed events leave no unknown type; an event voxserve.v1 has no message for is the case
    # that was `{"type": "future.event"}` (tests/transports/test_grpc_events.py: all of them).
    no_message = ev.Credit(window=4, acked_seq=None)
    assert grpc_events.encode_event(no_message, pb.ConverseResponse) is None
    assert grpc_events.encode_audio(b"\1\2", 3).audio.reply == 3


def test_session_ended_counters_come_through_clamped_to_unsigned() -> None:
    """Every counter field of voxserve.v1's SessionEnded carries the event's value, a
    negative one as 0 (the proto's fields are unsigned)."""
    ended = next(e for e, _ in SAMPLES if isinstance(e, ev.SessionEnded))
    ended = msgspec.structs.replace(ended, dropped=-1)
    response = grpc_events.encode_event(ended, pb.ConverseResponse)
    assert response is not None
    sent = response.ended
    counters = [f.name for f in sent.DESCRIPTOR.fields if f.type != f.TYPE_STRING]
    assert len(counters) == 12
    for name in counters:
        assert getattr(sent, name) == max(0, getattr(ended, name)), name
    assert sent.dropped == 0 and sent.received == ended.received > 0
    assert (sent.session_id, sent.trace_id, sent.reason) == ("s", "t", "completed")


def test_random_bytes_never_raise_anything_but_vox_errors() -> None:
    """A fuzz of the request path: whatever decodes, parsing gives input or a VoxError."""
    rng = random.Random(1234)
    seeds = [
        pb.ConverseRequest(config=pb.StreamConfig(sample_rate=16000, voice="joe")),
        pb.ConverseRequest(audio=pb.AudioFrames(seq_id=5, pcm=bytes(640))),
        pb.ConverseRequest(text=pb.TextInput(text="hello", flush=True)),
        pb.ConverseRequest(mark=pb.Mark(id="abc")),
    ]
    corpora = [seed.SerializeToString() for seed in seeds]
    for _ in range(3000):
        data = bytearray(rng.choice(corpora))
        for _ in range(rng.randint(1, 4)):
            if data and rng.random() < 0.7:
                data[rng.randrange(len(data))] = rng.randrange(256)
            else:
                data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
        try:
            request = pb.ConverseRequest.FromString(bytes(data))
        except DecodeError:
            continue
        try:
            item = codec.converse_input(request)
            if isinstance(item, pb.AudioFrames):
                codec.split_frames(item, 16_000, 200)
        except VoxError:
            pass
        if request.WhichOneof("request") == "config":
            try:
                codec.stream_config(request.config)
            except VoxError:
                pass


def test_turn_detection_maps_as_session_start_and_is_checked_the_same() -> None:
    semantic = pb.StreamConfig(turn_detection=pb.TurnDetection(type="semantic_vad"))
    assert codec.stream_config(semantic).turn_detection == TurnDetection(type="semantic_vad")
    fixed = pb.TurnDetection(type="server_vad", silence_duration_ms=300)
    config = codec.stream_config(pb.StreamConfig(turn_detection=fixed))
    assert config.turn_detection == TurnDetection(type="server_vad", silence_duration_ms=300)
    assert codec.stream_config(pb.StreamConfig()).turn_detection is None  # the server's
    bad = pb.TurnDetection(type="semantic_vad", eagerness="eager")
    with pytest.raises(VoxError) as refused:
        codec.stream_config(pb.StreamConfig(turn_detection=bad))
    assert refused.value.code is ErrorCode.INVALID_PARAMETER and refused.value.fatal

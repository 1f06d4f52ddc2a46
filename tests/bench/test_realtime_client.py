"""The Realtime client's side of the bench without a server: the OpenAI Realtime server events
a session produces (constructed in the documented order, GA and beta names) turned into the
same figures the /v1/stream client measures, the pieces it sends at real-time pace, and the
comparison's arithmetic."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
from typing import Any

import numpy as np
import pytest

from voxserve.bench.__main__ import main
from voxserve.bench.audio_client import AudioStream
from voxserve.bench.loadgen import StepSpec, make_stream, prepare_audio
from voxserve.bench.program import Script, build, frame_bytes, pcm_at
from voxserve.bench.realtime_bench import comparison, markdown
from voxserve.bench.realtime_client import (
    RealtimeStream,
    StreamPlan,
    frames_b64,
    session_update,
)
from voxserve.bench.realtime_turns import RealtimeTurns, b64_size
from voxserve.bench.records import Raw
from voxserve.bench.servers import realtime_url
from voxserve.bench.step import Step


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 16000)) / 16000
    return (np.sin(2 * np.pi * 300 * t) * 8000).astype(np.int16)


def quiet(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * 16000), dtype=np.int16)


# Two clips of 40 frames, speech at frames 10..29; each followed by 1 s: 90 frames a clip.
CLIP = np.concatenate([quiet(0.2), tone(0.4), quiet(0.2)])
PROGRAM = build([(CLIP, "hello"), (CLIP, "there")], gap_s=1.0)


def audio(ms: int) -> str:
    """base64 of `ms` of 24 kHz PCM16, as a response.output_audio.delta carries it."""
    return base64.b64encode(bytes(48 * ms)).decode()


def ev(kind: str, t: float, **fields: Any) -> tuple[dict[str, Any], float]:
    return {"type": kind, **fields}, t


def spoken_turn(item: str, start_ms: int, rid: str, *, beta: bool = False) -> list[Any]:
    """(event, t) of one server-VAD turn answered with audio, in the documented order."""
    delta = "response.audio.delta" if beta else "response.output_audio.delta"
    transcription = "conversation.item.input_audio_transcription"
    return [
        ev("input_audio_buffer.speech_started", 10.0, item_id=item, audio_start_ms=start_ms),
        ev(f"{transcription}.delta", 10.3, item_id=item, delta="he"),
        ev("input_audio_buffer.speech_stopped", 11.1, item_id=item, audio_end_ms=start_ms + 900),
        ev("input_audio_buffer.committed", 11.11, item_id=item, previous_item_id=None),
        ev("conversation.item.added", 11.11, item={"id": item}),
        ev(f"{transcription}.completed", 11.2, item_id=item, transcript="Hello."),
        ev("response.created", 11.21, response={"id": rid, "status": "in_progress"}),
        ev("response.output_audio_transcript.delta", 11.25, response_id=rid, delta="Hi"),
        ev(delta, 11.3, response_id=rid, item_id="a", delta=audio(200)),
        ev(delta, 11.4, response_id=rid, item_id="a", delta=audio(200)),
        ev("response.done", 11.6, response={"id": rid, "status": "completed"}),
    ]


def turns_for(raw: Raw) -> RealtimeTurns:
    turns = RealtimeTurns(raw, Script(PROGRAM), hangover_s=0.5, output_rate=24_000)
    turns.first_sent[0], turns.last_sent[0] = 10.0, 10.6  # utterance 0: frames 10..29
    return turns


def test_a_spoken_turn_gives_the_stream_figures() -> None:
    raw = Raw()
    turns = turns_for(raw)
    assert not turns.idle()  # utterance 0 was sent and not yet heard
    for event, t in spoken_turn("item_1", 200, "resp_1"):
        turns.on_event(event, t)
    turns.finish()
    assert raw.samples["vad_end"] == [pytest.approx(0.5)]
    assert raw.samples["ttfp"] == [pytest.approx(0.3)]
    assert raw.samples["turn"] == [pytest.approx(0.7)]  # 11.3 - 10.6
    assert raw.samples["final"] == [pytest.approx(0.6)]
    assert raw.samples["final_minus_hangover"] == [pytest.approx(0.1)]
    assert raw.transcripts == [("hello", "Hello.")]
    assert raw.counts["replies"] == 1 and raw.counts["audio_ms"] == 400
    assert raw.counts["segments"] == raw.counts["committed"] == raw.counts["finals"] == 1
    assert raw.samples["chunk_gap"] == [pytest.approx(0.1)]
    assert not raw.errors and turns.idle()


def test_beta_audio_deltas_and_a_second_utterance_matched_by_start() -> None:
    raw = Raw()
    turns = turns_for(raw)
    turns.last_sent[1] = 12.4  # utterance 1: program frames 100..119
    for event, t in spoken_turn("item_1", 200, "resp_1", beta=True):
        turns.on_event(event, t)
    assert not turns.idle()  # utterance 1 was sent, no speech_started matched it yet
    for event, t in spoken_turn("item_2", 100 * 20 - 100, "resp_2", beta=True):
        turns.on_event(event, t + 2.0)
    assert raw.samples["turn"] == [pytest.approx(0.7), pytest.approx(13.3 - 12.4)]
    assert turns.items == {"item_1": 0, "item_2": 1} and turns.idle()


def test_each_step_of_a_turn_keeps_the_session_busy() -> None:
    turns = turns_for(Raw())
    busy = []
    for event, t in spoken_turn("item_1", 200, "resp_1"):
        turns.on_event(event, t)
        busy.append(not turns.idle())
    assert busy == [True] * 10 + [False]  # idle only once the response is done


def test_barge_in_failures_and_errors_are_counted() -> None:
    raw = Raw()
    turns = turns_for(raw)
    cancelled = {"type": "cancelled", "reason": "turn_detected"}
    failed = {"type": "failed", "error": {"type": "server_error", "code": "responder_failed"}}
    events = [
        *spoken_turn("item_1", 200, "resp_1")[:-1],
        ev("response.done", 11.5, response={"id": "r1", "status": "cancelled"}),  # not ours
        ev("response.done", 11.5, response={"id": "resp_1", "status": "cancelled",
                                            "status_details": cancelled}),
        ev("response.created", 12.0, response={"id": "resp_2"}),
        ev("response.done", 12.1, response={"id": "resp_2", "status": "failed",
                                            "status_details": failed}),
        ev("error", 12.2, error={"type": "invalid_request_error", "code": "bad_audio"}),
        ev("error", 12.3, error={"type": "server_error"}),
        ev("conversation.item.input_audio_transcription.failed", 12.4, item_id="item_1",
           error={"code": "asr_failed"}),
        ev("response.output_audio.delta", 12.5, response_id="resp_9", delta=audio(20)),
    ]  # fmt: skip
    for event, t in events:
        turns.on_event(event, t)
    assert raw.counts["barge_ins"] == 1 and raw.counts["replies_interrupted"] == 1
    assert raw.counts["replies"] == 2 and raw.counts["replies_unmatched"] == 0
    assert raw.errors == {
        "response_responder_failed": 1,
        "bad_audio": 1,
        "server_error": 1,
        "transcription_asr_failed": 1,
    }
    assert raw.counts["audio_outside_reply"] == 1 and raw.counts["responses_unmatched"] == 1
    assert turns.idle()


def test_b64_size_without_decoding() -> None:
    for n in range(0, 12):
        assert b64_size(base64.b64encode(bytes(n)).decode()) == n


def test_the_program_at_24_khz_keeps_its_frames() -> None:
    pcm = pcm_at(PROGRAM, 24_000)
    assert frame_bytes(24_000) == 960 and len(pcm) == PROGRAM.frames * 960
    samples = np.frombuffer(pcm, dtype="<i2").reshape(PROGRAM.frames, 480).astype(float)
    loud = np.flatnonzero(np.sqrt((samples**2).mean(axis=1)) > 1000)
    assert list(loud) == [*range(10, 30), *range(100, 120)]  # the same frames are speech
    assert pcm_at(PROGRAM, 24_000) is pcm and pcm_at(PROGRAM, 16_000) is PROGRAM.pcm
    b64 = frames_b64(PROGRAM)
    assert base64.b64decode(b64[3] + b64[4]) == pcm[3 * 960 : 5 * 960]


def test_session_update_and_url_are_the_published_ga_shapes() -> None:
    update = session_update("whisper-1", "alloy")
    session = update["session"]
    assert update["type"] == "session.update" and session["type"] == "realtime"
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert session["audio"]["input"]["turn_detection"] == {"type": "server_vad"}
    assert session["audio"]["output"] == {
        "format": {"type": "audio/pcm", "rate": 24000},
        "voice": "alloy",
    }
    assert "voice" not in session_update("whisper-1", None)["session"]["audio"]["output"]
    assert (
        realtime_url("ws://127.0.0.1:8000/v1/stream", "gpt-realtime")
        == "ws://127.0.0.1:8000/v1/realtime?model=gpt-realtime"
    )


class Recorder:
    """Stands in for the socket in `produce` only: what was sent, and when."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, dict[str, Any]]] = []

    async def send(self, message: str) -> None:
        self.sent.append((time.monotonic(), json.loads(message)))


@pytest.mark.parametrize("piece_ms", [20, 40])
def test_produce_paces_pieces_and_times_the_end_of_speech(piece_ms: int) -> None:
    raw = Raw()
    ws = Recorder()

    async def play() -> RealtimeStream:
        end_at = time.monotonic() + 0.8  # 40 frames: the first clip
        plan = StreamPlan(Script(PROGRAM), end_at, drain_s=1.0, hangover_s=0.1)
        stream = RealtimeStream("ws://unused", raw, plan, piece_ms=piece_ms)
        await stream.produce(ws)  # type: ignore[arg-type]
        return stream

    stream = asyncio.run(play())
    per = piece_ms // 20
    tail = 20  # ceil((0.1 + 0.3) / 0.02) frames of silence
    assert raw.counts["frames_sent"] == len(ws.sent) * per >= 40 + tail
    assert all(m["type"] == "input_audio_buffer.append" for _, m in ws.sent)
    sizes = {len(base64.b64decode(m["audio"])) for _, m in ws.sent}
    assert sizes == {960 * per}
    joined = b"".join(base64.b64decode(m["audio"]) for _, m in ws.sent[: 40 // per])
    assert joined == pcm_at(PROGRAM, 24_000)[: 40 * 960]
    # utterance 0's last speech frame (29) went out with the piece that holds it
    piece = 29 // per
    assert stream.turns.last_sent[0] == pytest.approx(ws.sent[piece][0], abs=0.005)
    assert stream.turns.first_sent[0] == pytest.approx(ws.sent[10 // per][0], abs=0.005)
    # real-time pace: piece i leaves when its last frame is complete, 20 ms per frame
    span = ws.sent[-1][0] - ws.sent[0][0]
    assert span == pytest.approx((len(ws.sent) - 1) * piece_ms / 1000, abs=0.05)
    assert len(stream.plan.lateness) == len(ws.sent)


def step(transport: str, streams: int, turns: list[float], cpu: float) -> Step:
    raw = Raw()
    for t in turns:
        raw.add("turn", t)
    record = {"transport": transport, "streams": streams, "server": {"cpu_percent": cpu}}
    return Step(record | {"valid": True}, raw)


def test_comparison_pools_rounds_and_subtracts() -> None:
    steps = [
        step("stream", 4, [0.50, 0.52], 10.0),
        step("realtime", 4, [0.51, 0.56], 12.0),
        step("realtime", 4, [0.53, 0.90], 14.0),
        step("stream", 4, [0.54, 0.60], 11.0),
    ]
    (row,) = comparison(steps, ["stream", "realtime"])
    assert row["stream"]["turn_count"] == 4 and row["stream"]["rounds"] == 2
    assert row["stream"]["turn_p50_ms"] == 520.0 and row["stream"]["turn_p99_ms"] == 600.0
    assert row["realtime"]["turn_p50_ms"] == 530.0 and row["realtime"]["turn_p99_ms"] == 900.0
    assert row["realtime"]["server_cpu_percent"] == 13.0
    assert row["realtime"]["server_cpu_percent_per_stream"] == 3.25
    assert row["realtime_minus_stream_ms"]["turn_p50_ms"] == 10.0
    assert row["realtime_minus_stream_ms"]["turn_p99_ms"] == 300.0


def test_comparison_scores_each_transport_s_words_on_the_same_recordings() -> None:
    """WER per transport over its rounds, and the utterances heard differently (matched by
    reference: the streams play the same recordings on both)."""
    ws, rtc = step("realtime", 2, [0.5], 10.0), step("webrtc", 2, [0.6], 12.0)
    for raw, heard in ((ws.raw, "Please tell me a joke."), (rtc.raw, "please tell me a Joe")):
        raw.counts["finals"] = 2
        raw.transcripts += [("What time is it?", "What time is it"), ("Tell me a joke.", heard)]
    (row,) = comparison([ws, rtc], ["realtime", "webrtc"])
    assert row["realtime"]["wer"] == pytest.approx(1 / 8, abs=1e-4)  # "please" inserted
    assert row["webrtc"]["wer"] == pytest.approx(2 / 8, abs=1e-4)  # and "joe" for "joke"
    assert row["realtime"]["utterances_scored"] == row["webrtc"]["utterances_scored"] == 2
    assert row["webrtc_vs_realtime_transcripts_differing"] == 1
    knee = {t: {"streams": 2, "broke_at": None} for t in ("realtime", "webrtc")}
    extra = {"comparison": [row], "budget": {"metric": "turn", "p99_ms": 1000.0}, "knee": knee}
    table = markdown(extra, ["realtime", "webrtc"])
    assert "| 0.250 (2) |" in table and "+0.125; 1 differ" in table, table


def test_the_command_refuses_unknown_transports(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["realtime", "--transports", "stream,grpc"])
    assert "expected some of stream,realtime" in capsys.readouterr().err


def test_a_realtime_ramp_needs_a_budget_it_measures(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ramp", "--mode", "realtime", "--url", "ws://127.0.0.1:9", "--quiet"])
    assert code == 2 and "use --budget-metric turn" in capsys.readouterr().err


@pytest.mark.parametrize(("mode", "rate"), [("assistant", 24_000), ("realtime", 24_000)])
def test_a_step_s_audio_is_made_before_its_streams_start(
    monkeypatch: pytest.MonkeyPatch, mode: str, rate: int
) -> None:
    """`prepare_audio` (loadgen.drive, before start_at) resamples the program once; a
    stream's first frame then finds it made. Made there instead (73-106 ms for the
    fixtures), it held the loop after the streams' clocks had started, and a step was
    judged invalid for its P99 send lateness on an idle machine (test_smoke.py)."""
    import voxserve.audio.resample as resampling

    made: list[int] = []
    real = resampling.resample

    def counted(samples: Any, rate_in: int, rate_out: int) -> Any:
        made.append(rate_out)
        return real(samples, rate_in, rate_out)

    monkeypatch.setattr(resampling, "resample", counted)
    program = build([(CLIP, "fresh")], gap_s=1.0)  # not resampled yet in this process
    spec = StepSpec(
        url="ws://127.0.0.1:9/v1/stream", mode=mode, streams=1, duration_s=1.0,
        ramp_s=0.0, program=program, session={"sample_rate": rate},
    )  # fmt: skip
    prepare_audio(spec)
    assert made == [rate]
    if mode == "realtime":
        frames_b64(program)
    else:
        pcm_at(program, rate)  # what AudioStream.produce asks for on its first frame
    assert made == [rate]  # nothing more to make once the clock runs


def test_make_stream_builds_either_client_with_the_key() -> None:
    spec = StepSpec(
        url="ws://127.0.0.1:9/v1/stream", mode="realtime", streams=2, duration_s=1.0,
        ramp_s=0.0, program=PROGRAM, api_key="k1", model="m 1", piece_ms=40,
        session={"sample_rate": 24000, "voice": "alloy"},
    )  # fmt: skip
    realtime = make_stream(spec, 1, Raw(), 0.0)
    assert isinstance(realtime, RealtimeStream)
    assert realtime.url == "ws://127.0.0.1:9/v1/realtime?model=m+1"
    assert realtime.headers == {"Authorization": "Bearer k1"} and realtime.piece_frames == 2
    assert realtime.plan.script.shift == PROGRAM.clip_starts[1]
    assert realtime.plan.session_update()["session"]["audio"]["output"]["voice"] == "alloy"
    stream = make_stream(dataclasses.replace(spec, mode="assistant"), 0, Raw(), 0.0)
    assert isinstance(stream, AudioStream) and stream.rate == 24000
    assert stream.headers == {"Authorization": "Bearer k1"}
    assert stream.start["sample_rate"] == 24000 and stream.start["mode"] == "assistant"


def test_the_realtime_command_leaves_the_other_commands_modes_alone() -> None:
    """`bench realtime` sets its mode itself: a sub-parser default would change the `--mode`
    action the commands share, and soak/stream/ramp would run Realtime streams."""
    import argparse

    from voxserve.bench.cli import add_bench_parser

    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    for command in ("stream", "ramp", "soak"):
        assert parser.parse_args(["bench", command]).mode == "asr", command

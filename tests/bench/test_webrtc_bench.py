"""`--mode webrtc` of the bench: the server frame lag read from /metrics, the turns of a call
(first reply sound heard on the track), and a short real run of `bench realtime
--transports realtime,webrtc` against a load-engines server (real aiortc callers)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.conftest import LiveServer
from voxserve.bench import frame_lag
from voxserve.bench.__main__ import main
from voxserve.bench.program import Utterance, build, scripts
from voxserve.bench.records import Raw
from voxserve.bench.webrtc_stream import WebRtcTurns

ROOT = Path(__file__).resolve().parents[2]

# --- the frame lag histogram ------------------------------------------------------------------

BEFORE = {0.001: 10.0, 0.02: 10.0, 0.05: 10.0, math.inf: 10.0}
AFTER = {0.001: 900.0, 0.02: 1000.0, 0.05: 1009.0, math.inf: 1010.0}


def test_frame_lag_of_a_step_is_the_bucket_difference() -> None:
    step = frame_lag.during(BEFORE, AFTER)
    assert step == {0.001: 890.0, 0.02: 990.0, 0.05: 999.0, math.inf: 1000.0}
    summary = frame_lag.summary(step)
    # 89% on time within 1 ms; the 99th percentile frame in the 20 ms bucket; 1% over 20 ms
    assert summary == {"count": 1000, "p50": 1.0, "p90": 20.0, "p99": 20.0, "over_20ms_share": 0.01}


def test_frame_lag_past_the_last_bucket_has_no_figure() -> None:
    late = {0.02: 50.0, 0.2: 60.0, math.inf: 100.0}
    assert frame_lag.quantile_ms(late, 0.99) is None
    assert frame_lag.quantile_ms(late, 0.5) == 20.0
    assert frame_lag.summary({0.02: 0.0, math.inf: 0.0}) is None


def test_frame_lag_buckets_round_trip_json_and_pool() -> None:
    data = json.loads(json.dumps(frame_lag.to_json(AFTER)))
    assert list(data) == ["0.001", "0.02", "0.05", "+Inf"]
    assert frame_lag.from_json(data) == AFTER
    assert frame_lag.pooled([AFTER, None, BEFORE]) == {
        0.001: 910.0,
        0.02: 1010.0,
        0.05: 1019.0,
        math.inf: 1020.0,
    }


# --- the turns of a call --------------------------------------------------------------------


def _turns() -> tuple[WebRtcTurns, Raw]:
    import numpy as np

    tone = (np.sin(np.arange(16_000) / 5) * 8000).astype(np.int16)  # 1 s of "speech"
    program = build([(tone, "hello there")], 2.0)
    assert program.utterances[0] == Utterance("hello there", 0, 49)
    raw = Raw()
    (script,) = scripts(program, [0])
    return WebRtcTurns(raw, script, hangover_s=0.5), raw


def _response(kind: str, rid: str, **fields: object) -> dict[str, object]:
    return {"type": kind, "response": {"id": rid, **fields}}


def test_a_reply_is_heard_when_its_first_sound_arrives_even_after_response_done() -> None:
    turns, raw = _turns()
    turns.last_sent[0] = 10.0  # the utterance's last speech frame went at t = 10 s
    turns.on_event({"type": "input_audio_buffer.speech_started", "item_id": "u0"}, 10.1)
    turns.on_event({"type": "input_audio_buffer.committed", "item_id": "u0"}, 10.6)
    turns.on_event(_response("response.created", "r1"), 10.62)
    turns.on_event(_response("response.done", "r1", status="completed"), 10.63)
    assert not turns.idle()  # the reply is not heard yet
    turns.on_sound(10.7)  # the track's first sound came after response.done: still r1's
    assert raw.samples["turn"] == [pytest.approx(0.7)]
    assert raw.counts["replies_heard"] == 1 and turns.idle()
    turns.on_sound(11.5)  # a pause inside the reply: a new run of sound, no reply
    assert raw.counts["sound_outside_reply"] == 1 and raw.samples["turn"] == [pytest.approx(0.7)]


def test_a_cancelled_reply_without_sound_is_not_waited_for() -> None:
    turns, raw = _turns()
    turns.on_event(_response("response.created", "r1"), 1.0)
    turns.on_event(
        _response("response.done", "r1", status="cancelled", status_details={"reason": "x"}), 1.1
    )
    turns.on_event(_response("response.created", "r2"), 2.0)
    turns.on_sound(2.2)
    assert raw.counts["replies_heard"] == 1
    assert raw.counts["replies_unmatched"] == 1  # r2 answers no utterance sent here
    assert not turns.unheard


# --- a short real run (load_server: tests/bench/conftest.py) --------------------------------


def test_webrtc_calls_against_realtime_sessions_smoke(
    load_server: LiveServer, tmp_path: Path
) -> None:
    """2 Realtime WebSocket sessions, then 2 WebRTC calls, 3 s each: both have turns, the
    calls the server's frame lag, CPU per stream and the webrtc - realtime row."""
    out = tmp_path / "webrtc"
    argv = ["realtime", "--url", f"ws://127.0.0.1:{load_server.settings.port}"]
    argv += ["--transports", "realtime,webrtc", "--streams", "2", "--duration", "3"]
    argv += ["--cooldown", "0.5", "--budget-ms", "5000", "--out", str(out), "--quiet"]
    assert main([*argv, "--audio-dir", str(ROOT / "tests" / "fixtures")]) == 0
    summary = json.loads((out / "summary.json").read_text())
    realtime, webrtc = summary["steps"]
    assert (webrtc["transport"], webrtc["mode"]) == ("webrtc", "webrtc")
    for step in (realtime, webrtc):
        assert step["errors"] == {} and step["error_rate"] == 0, step
        assert step["counts"]["sessions"] == 2 and step["counts"]["finals"] >= 2, step
        assert 400 < step["latency_ms"]["turn"]["p50"] < 3000, step["latency_ms"]
    assert webrtc["counts"]["replies_heard"] >= 2 and webrtc["counts"]["audio_ms"] > 0
    assert webrtc["counts"]["packets_sent"] >= 2 * 100 and webrtc["counts"]["packets_dropped"] == 0
    lag = webrtc["latency_ms"]["frame_lag"]  # the server's outgoing frames, from /metrics
    assert lag["count"] >= 2 * 100, lag
    (row,) = summary["comparison"]
    assert row["webrtc"]["server_cpu_percent_per_stream"] is not None
    assert "frame_lag_p50_ms" in row["webrtc"] and "frame_lag_p50_ms" not in row["realtime"]
    assert row["webrtc_minus_realtime_ms"]["turn_p50_ms"] == pytest.approx(
        row["webrtc"]["turn_p50_ms"] - row["realtime"]["turn_p50_ms"], abs=0.1
    )
    text = (out / "summary.md").read_text()
    assert "## Realtime (WebSocket) vs WebRTC calls" in text and "| 2 | webrtc - realtime |" in text


def test_loss_must_be_a_share(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["stream", "--mode", "webrtc", "--loss", "1.5", "--url", "ws://127.0.0.1:9"])
    assert exc.value.code == 2
    assert "expected a share in [0, 1)" in capsys.readouterr().err


def test_a_webrtc_ramp_has_no_marks_to_budget(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["ramp", "--mode", "webrtc", "--url", "ws://127.0.0.1:9", "--quiet"]
    assert main([*argv, "--out", "/nonexistent/never-written"]) == 2  # mark_lag: refused
    assert "webrtc streams send no marks" in capsys.readouterr().err

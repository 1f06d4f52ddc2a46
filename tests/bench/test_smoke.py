"""A short real run: `bench stream` with 4 streams for 3 s against a server with the load
engines, then the files it wrote. The stream bench spawns its server (`--spawn`), as a real
run does: beside a server in this process its load generator shared the GIL, and one stall
of the process (47 ms, once in CI) made the run invalid as "load generator behind
schedule", a verdict about the test's layout, not the bench or the server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveServer
from voxserve.bench.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def test_stream_smoke(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = main(
        [
            "stream",
            "--spawn",
            "--server-config",
            str(ROOT / "bench" / "load-engines.toml"),
            "--streams",
            "4",
            "--duration",
            "3",
            "--mode",
            "asr",
            "--audio-dir",
            str(ROOT / "tests" / "fixtures"),
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    for p in ("p50", "p90", "p99"):
        assert summary[p]["mark_lag_ms"] > 0
        assert summary[p]["final_ms"] > 0
    (step,) = summary["steps"]
    assert step["streams"] == 4 and step["valid"], step["invalid_reasons"]
    assert step["errors"] == {} and step["error_rate"] == 0
    assert step["counts"]["marks"] > 10 and step["counts"]["finals"] >= 1
    assert step["counts"]["server_processed"] == step["counts"]["frames_sent"]
    assert step["server"]["pid"] > 0 and step["server"]["cpu_percent"] is not None
    batches = step["engine_batches"]  # read from the server's /metrics around the step
    assert batches["vad"]["batches"] > 0 and batches["vad"]["mean_size"] >= 1
    # every final is an ASR request; decodes at pauses (vad.speculate_ms) may add more
    assert batches["asr"]["requests"] >= step["counts"]["finals"]
    assert 0 <= batches["asr"]["share_of_one"] <= 1
    assert step["loadgen"]["send_lateness_ms"]["p99"] is not None
    assert (out / "latency_cdf.png").stat().st_size > 1000
    assert len((out / "steps.jsonl").read_text().splitlines()) == 1
    assert "| 4 streams | 4 | yes |" in (out / "summary.md").read_text()


def test_http_speech_smoke(load_server: LiveServer, tmp_path: Path) -> None:
    out = tmp_path / "tts"
    url = f"ws://127.0.0.1:{load_server.settings.port}"
    argv = ["tts", "--url", url, "--rate", "10", "--duration", "1.5", "--out", str(out)]
    assert main([*argv, "--procs", "0", "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (step,) = summary["steps"]
    assert step["counts"]["requests_ok"] == step["counts"]["requests"] > 5
    assert summary["p99"]["first_audio_ms"] > 0 and step["error_rate"] == 0


def test_realtime_vs_stream_smoke(tmp_path: Path) -> None:
    """`bench realtime`: 2 assistant streams through /v1/stream, then 2 through the OpenAI
    Realtime doorway, for 4 s each; both have turns, no errors, and the comparison. The
    server is spawned, as the bench is run: in this process (the module's load_server) its
    work held the GIL while the load generator was due, and a step was judged invalid for
    the generator's lateness (CI: P99 send lateness 35.9 ms > 10 ms)."""
    out = tmp_path / "realtime"
    config = str(ROOT / "bench" / "load-engines.toml")
    argv = ["realtime", "--spawn", "--server-config", config]
    argv += ["--streams", "2", "--duration", "4", "--cooldown", "0.5", "--out", str(out)]
    argv += ["--budget-ms", "5000"]  # a busy machine must not make the knee flaky
    assert main([*argv, "--audio-dir", str(ROOT / "tests" / "fixtures"), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    stream, realtime = summary["steps"]
    assert (stream["transport"], stream["mode"]) == ("stream", "assistant")
    assert stream["sample_rate"] == stream["output_sample_rate"] == 24000
    assert (realtime["transport"], realtime["mode"]) == ("realtime", "realtime")
    for step in (stream, realtime):
        assert step["valid"] and step["errors"] == {} and step["error_rate"] == 0, step
        assert step["counts"]["sessions"] == 2 and step["counts"]["replies"] >= 2
        assert step["counts"]["utterances"] >= 2 and step["counts"]["finals"] >= 2
        assert step["counts"]["audio_ms"] > 0 and step["within_budget"]
        # the load engines: from the end of speech, the 500 ms hangover and a little
        assert 400 < step["latency_ms"]["turn"]["p50"] < 3000
        assert 400 < step["latency_ms"]["vad_end"]["p50"] < 3000

    # The same audio at the same pace: each stream sends from its handshake's end to the
    # step's end, so a handshake's length comes off its frames. Counted back in, the two
    # transports sent the same; raw counts differed by whatever the handshakes took on a
    # loaded machine (Realtime's has one more round trip), which failed `<= 10` frames.
    def paced(step: dict[str, Any]) -> float:
        connect = step["latency_ms"]["connect"]
        return step["counts"]["frames_sent"] + connect["mean"] * step["counts"]["sessions"] / 20

    assert abs(paced(realtime) - paced(stream)) <= 10, (stream, realtime)
    assert realtime["counts"]["committed"] == realtime["counts"]["segments"] >= 2
    (row,) = summary["comparison"]
    assert row["streams"] == 2 and row["realtime"]["turn_count"] >= 2
    assert row["realtime_minus_stream_ms"]["turn_p50_ms"] == pytest.approx(
        row["realtime"]["turn_p50_ms"] - row["stream"]["turn_p50_ms"], abs=0.1
    )
    for transport in ("stream", "realtime"):
        assert summary["knee"][transport]["streams"] == 2
        assert summary["knee"][transport]["streams_per_core"] > 0
    assert summary["p50"]["turn_ms"] == realtime["latency_ms"]["turn"]["p50"]
    text = (out / "summary.md").read_text()
    assert "## Realtime vs /v1/stream" in text and "| 2 | realtime - stream |" in text

"""`voxserve bench wyoming` against a real Wyoming server on fake engines: one recording at
real-time pace, its figures and the chunks-join check written to --out."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import fake_runtime, silence, tone
from voxserve.audio.wav import write_wav
from voxserve.bench.cli import add_bench_parser, run_bench
from voxserve.config import load_settings


@pytest.fixture(scope="module")
def wyoming_server() -> Iterator[LiveServer]:
    settings = load_settings(port=free_port(), log_level="warning")
    live = start_server(settings, fake_runtime(settings), wyoming_port=free_port())
    yield live
    stop_server(live)


def bench(live: LiveServer, tmp_path: Path, *flags: str) -> dict[str, Any]:
    """`bench wyoming` over one 1.1 s recording of a tone; its summary row."""
    pcm = np.concatenate([silence(0.2), tone(500, 0.8), silence(0.1)])
    (tmp_path / "tone.wav").write_bytes(write_wav(pcm, 16_000))
    (tmp_path / "fixtures.json").write_text(json.dumps({"tone.wav": "tone500"}))
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    out = tmp_path / "out"
    target = f"vox=127.0.0.1:{live.settings.wyoming_port}"
    flags += ("--rounds", "1", "--audio-dir", str(tmp_path), "--out", str(out))
    args = parser.parse_args(["bench", "wyoming", "--target", target, *flags])
    assert run_bench(args) == 0
    row: dict[str, Any] = json.loads((out / "summary.json").read_text())["vox"]
    return row


def test_one_recording_gives_the_latency_figures(
    wyoming_server: LiveServer, tmp_path: Path
) -> None:
    row = bench(wyoming_server, tmp_path, "--tail-ms", "600")
    assert row["requests"] == 1 and row["wer"] == 0.0 and row["chunks_join_to_final"]
    assert row["chunks_per_request"] >= 1  # a one-word transcript: its chunk is the final's
    assert row["final_s"]["p50"] >= 1650  # not before the paced audio (1.7 s) was all sent
    assert row["final_after_stop_s"]["p50"] >= 0


def test_at_once_sends_the_recording_without_pacing(
    wyoming_server: LiveServer, tmp_path: Path
) -> None:
    row = bench(wyoming_server, tmp_path, "--tail-ms", "0", "--at-once", "--budget-ms", "0")
    assert row["requests"] == 1 and row["wer"] == 0.0
    assert row["final_s"]["p50"] < 800  # paced, 1.1 s of audio takes 1.1 s to send
    assert row["final_after_stop_s"]["p50"] >= 0
    assert row["late"] == 1  # no transcript comes within 0 ms of audio-stop


def test_a_burst_sends_its_requests_at_once(wyoming_server: LiveServer, tmp_path: Path) -> None:
    flags = ("--tail-ms", "0", "--at-once", "--concurrency", "4", "--budget-ms", "30000")
    row = bench(wyoming_server, tmp_path, *flags)
    assert row["requests"] == 4 and row["refused"] == 0 and row["wer"] == 0.0
    assert row["final_after_stop_s"]["count"] == 4
    assert row["late"] == 0  # each within 30 s of its audio-stop


def test_refusals_are_counted_with_their_code_not_measured(tmp_path: Path) -> None:
    """A server that refuses every request (1.1 s of audio past its 0.5 s limit): each
    refusal is counted with its code and time; no transcript figure comes from them."""
    settings = load_settings(port=free_port(), log_level="warning")
    settings = settings.model_copy(
        update={"wyoming": settings.wyoming.model_copy(update={"max_audio_s": 0.5})}
    )
    live = start_server(settings, fake_runtime(settings), wyoming_port=free_port())
    try:
        row = bench(live, tmp_path, "--tail-ms", "0", "--at-once", "--concurrency", "3")
    finally:
        stop_server(live)
    assert row["requests"] == 3 and row["refused"] == 3
    assert row["final_after_stop_s"]["count"] == 0 and row["wer"] is None
    assert row["refused_codes"] == ["message_too_large"]  # the server's documented code
    assert row["refused_after_s"]["count"] == 3

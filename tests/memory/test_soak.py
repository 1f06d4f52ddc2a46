"""The CI-sized soak: `voxserve bench soak` against a spawned server for ~15 s of paced
streams, each a run of 2-second sessions (churn: ~80 sessions opened and closed), after a
2 s warm-up (what opens once on first use is not a leak). Checks
what a short run can: no leaked tasks or fds, every pool buffer back, a
tracemalloc diff taken, and no gross RSS growth (the 2% criterion needs the 10-minute run
in docs/benchmarks.md; warm-up effects dominate a short one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_short_soak_leaks_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    cmd = [sys.executable, "-m", "voxserve", "bench", "soak", "--spawn"]
    cmd += ["--server-config", "bench/load-engines.toml", "--streams", "20"]
    cmd += ["--duration", "10", "--warmup", "4", "--sample-every", "0.5"]
    cmd += ["--max-rss-growth", "15", "--procs", "0", "--quiet", "--out", str(out)]
    cmd += ["--session-s", "2"]
    env = {**os.environ, "VOXSERVE_GC__FREEZE_AFTER_LOAD": "true"}  # the production setting
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    summary = json.loads((out / "soak.json").read_text())
    assert run.returncode == 0, (summary["problems"], run.stderr[-2000:])
    assert summary["pass"] and not summary["problems"]
    before, after = summary["idle_before"], summary["idle_after"]
    assert after["tasks"] <= before["tasks"] and after["fds"] <= before["fds"]
    assert after["pool_in_use"] == 0 and after["sessions"] == 0
    assert summary["tracemalloc"]["top"], summary["tracemalloc"]
    assert summary["load"]["errors"] == {} and summary["load"]["counts"]["finals"] > 0
    # Churn: every stream slot closed a session and opened another (20 streams x ~10 s in
    # 2 s sessions: ~60-75 sessions as this machine's pace allows; the count is a clock
    # figure, so the soak's own record of which slots churned is what is asserted).
    assert summary["churned_streams"] == 20, summary
    assert summary["sessions"] >= 2 * 20, summary["sessions"]
    assert summary["load"]["counts"]["server_processed"] == summary["load"]["counts"]["frames_sent"]
    assert "tracemalloc, warm-up -> end of load" in (out / "soak.md").read_text()

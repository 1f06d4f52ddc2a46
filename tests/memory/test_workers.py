"""`voxserve serve --workers N`: fork safety of the engines loaded before fork, one port
served by every worker, supervision (a killed worker comes back), SIGHUP and the CLI reload,
and SIGTERM ending everything with exit 0. Real processes, real sockets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.sync.client import connect

from tests.conftest import free_port
from tests.helpers import wait_ready
from voxserve.server.workers import fork_safe

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "workers-admin-key"

# Builds one engine, forks, and calls it in the child under an alarm: a library whose
# threads did not survive the fork hangs there (CTranslate2 does; tests the table).
PROBE = """
import os, signal, sys
import numpy as np
from voxserve.config import EngineSpec
from voxserve.engines.loaded import build_engine as _build
kind, name = sys.argv[1], sys.argv[2]
engine, _ = _build(kind, EngineSpec(name=name), 1)
pid = os.fork()
if pid == 0:
    signal.alarm(20)
    if kind == "vad":
        engine.speech_probs(engine.new_state(), np.zeros(1024, dtype=np.float32))
    elif kind == "asr":
        engine.transcribe(np.zeros(16000, dtype=np.float32))
    else:
        list(engine.synthesize("Hello there.", voice=engine.voices()[0].id))
    os._exit(0)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


# Measured fork-safe on this stack (onnxruntime with 1 intra-op thread, espeak-ng); each
# class declares it (engines/base.py `fork_safe`). Responders: no model call to probe.
FORK_SAFE = [("vad", "silero"), ("tts", "piper"), ("tts", "espeak")]
FORK_SAFE += [("vad", "load"), ("asr", "load"), ("tts", "load")]


def test_engines_declare_fork_safety() -> None:
    """What `serve --workers` preloads is what each class declares: these, and not
    whisper (whose first transcription hangs in a child) or cosyvoice (a gRPC channel)."""
    assert all(fork_safe(kind, name) for kind, name in FORK_SAFE)
    assert fork_safe("responder", "rules") and fork_safe("responder", "echo")
    assert not fork_safe("asr", "whisper") and not fork_safe("tts", "cosyvoice")


@pytest.mark.parametrize(("kind", "name"), FORK_SAFE)
def test_engines_loaded_before_fork_work_in_the_child(kind: str, name: str) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, kind, name], cwd=ROOT, capture_output=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr.decode()[-2000:]


def children_of(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found |= {int(child) for child in text}
    return found


def transcribe_once(url: str) -> dict[str, object]:
    with connect(url) as ws:
        ws.send(json.dumps({"type": "session.start", "mode": "asr"}))
        assert json.loads(ws.recv())["type"] == "session.started"
        tone = (0.3 * 32767 * np.sin(np.arange(8000) * 0.1)).astype("<i2")
        for seq in range(25):
            ws.send(seq.to_bytes(4, "big") + tone[seq * 320 : (seq + 1) * 320].tobytes())
        ws.send(json.dumps({"type": "audio.end"}))
        while True:
            event = json.loads(ws.recv(timeout=10))
            if event["type"] == "session.ended":
                return dict(event)


def test_workers_share_the_port_are_supervised_reload_and_stop_cleanly(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "VOXSERVE_ADMIN_KEY": ADMIN, "XDG_CACHE_HOME": str(tmp_path)}
    env["VOXSERVE_GC__FREEZE_AFTER_LOAD"] = "true"  # as in production: frozen before fork
    cmd = [sys.executable, "-m", "voxserve", "serve", "--config", "bench/load-engines.toml"]
    cmd += ["--port", str(port), "--workers", "2", "--log-format", "text"]
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        wait_ready(proc, port, tmp_path / "server.log")
        while len(children_of(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = children_of(proc.pid)
        assert len(workers) == 2
        # Both workers accept on the one port (the kernel spreads the connections) and are
        # ready: wait_ready saw one worker's /readyz; the other may still be making its
        # fallback phrase, and would refuse a stream with not_ready.
        seen = set()
        while seen != workers and time.monotonic() < deadline:
            with httpx.Client() as fresh:  # a new connection each time
                body = fresh.get(f"{base}/debug/memory", headers=_admin()).json()
            if body["ready"]:
                seen.add(int(body["pid"]))
        assert seen == workers
        ended = transcribe_once(f"ws://127.0.0.1:{port}/v1/stream")
        assert ended["processed"] == ended["received"] == 25

        # A worker that dies is started again.
        victim = next(iter(workers))
        os.kill(victim, signal.SIGKILL)
        while time.monotonic() < deadline:
            now = children_of(proc.pid)
            if len(now) == 2 and victim not in now:
                break
            time.sleep(0.1)
        assert len(children_of(proc.pid)) == 2 and victim not in children_of(proc.pid)

        # SIGHUP reloads every worker's engines: each worker answers generation 2.
        workers = children_of(proc.pid)
        ready: set[int] = set()
        while ready != workers and time.monotonic() < deadline:  # the new worker serves
            with httpx.Client() as fresh:
                body = fresh.get(f"{base}/debug/memory", headers=_admin()).json()
            if body["ready"]:
                ready.add(int(body["pid"]))
        os.kill(proc.pid, signal.SIGHUP)
        reloaded: set[int] = set()
        while reloaded != workers and time.monotonic() < deadline:
            with httpx.Client() as fresh:  # a new connection: any worker may answer
                body = fresh.get(f"{base}/debug/memory", headers=_admin()).json()
            if max(g["generation"] for g in body["generations"]) >= 2:
                reloaded.add(int(body["pid"]))
        assert reloaded == workers
        # The CLI reloads the worker it reaches once more.
        cli = subprocess.run(
            [sys.executable, "-m", "voxserve", "engines", "reload", "--url", base],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        assert "engines reloaded: generation 2 -> 3" in cli.stdout
        assert transcribe_once(f"ws://127.0.0.1:{port}/v1/stream")["processed"] == 25
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        log.close()
    text = (tmp_path / "server.log").read_text()
    assert code == 0, text[-3000:]
    assert "engine loaded before fork (shared)" in text
    assert "worker exited; starting it again" in text


def _admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}

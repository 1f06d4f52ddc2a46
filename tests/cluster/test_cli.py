"""`voxserve cluster up / status / down` and `voxserve serve --cluster`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import TwoNodes, need_ray
from tests.conftest import free_port
from voxserve.cli.app import main
from voxserve.cli.serve import with_cluster
from voxserve.config import load_settings

LOAD_CORE = """
[engines]
asr = {name = "load"}
tts = [{name = "load"}]
[cluster]
app_name = "vxcli"
asr = {num_cpus = 0.25}
tts = {num_cpus = 0.25, num_replicas = 2, max_replicas_per_node = 1}
"""


def voxserve(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "voxserve", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, **env},
    )


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (from /proc), so the test can see none is left over."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(pid)
    return left


def test_cluster_up_runs_a_local_two_node_core_until_sigterm_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    need_ray()
    config = tmp_path / "core.toml"
    config.write_text(LOAD_CORE)
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "voxserve",
            "cluster",
            "up",
            "--nodes",
            "2",
            "--config",
            str(config),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert up.stdout is not None
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = up.stdout.readline()
            assert line, f"cluster up ended early: {lines}"
            lines.append(line)
            if line.startswith("voxserve cluster up at "):
                break
        address = lines[-1].split(" at ", 1)[1].split(":", 2)
        address_text = f"{address[0]}:{address[1]}"
        assert "tts voices load" in lines[-1]

        status = voxserve(
            "cluster", "status", "--json", "--address", address_text, "--config", str(config)
        )
        assert status.returncode == 0, status.stderr
        tiers = json.loads(status.stdout)
        assert tiers["asr"]["status"] == tiers["tts"]["status"] == "RUNNING"
        assert tiers["asr"]["replicas"] == {"RUNNING": 1}
        assert tiers["tts"]["replicas"] == {"RUNNING": 2}  # one per simulated node

        down = voxserve("cluster", "down", "--address", address_text, "--config", str(config))
        assert down.returncode == 0, down.stderr
        assert down.stdout.strip() == "deleted: vxcli-asr, vxcli-tts"
        status = voxserve(
            "cluster", "status", "--json", "--address", address_text, "--config", str(config)
        )
        assert json.loads(status.stdout)["asr"]["status"] == "NOT_DEPLOYED"

        ray_processes = descendants(up.pid)
        assert ray_processes  # the head's GCS, raylet, workers
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=60) == 0
        deadline = time.monotonic() + 20
        while alive(ray_processes) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive(ray_processes), "processes left after cluster up stopped"
    finally:
        if up.poll() is None:  # a failed assertion: stop it the normal way, else by force
            left = descendants(up.pid)
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(timeout=30)
            except subprocess.TimeoutExpired:
                for pid in (up.pid, *alive(left)):
                    os.kill(pid, signal.SIGKILL)
                up.wait()


def test_status_shows_both_tiers_of_a_running_core(
    two_nodes: TwoNodes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "vx.toml"
    config.write_text('[cluster]\napp_name = "vxtest"\n')
    assert main(["cluster", "status", "--address", two_nodes.address, "--config", str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        "asr: vxtest-asr RUNNING (replicas: running 2)",
        "tts: vxtest-tts RUNNING (replicas: running 2)",
    ], out


def test_serve_cluster_flag_rewrites_only_asr_and_tts() -> None:
    need_ray()  # the flag checks that Ray is installed
    settings = load_settings(port=0)
    assert with_cluster(settings, None) is settings  # off unless asked
    gateway = with_cluster(settings, "127.0.0.1:6379")
    assert gateway.cluster.enabled and gateway.cluster.address == "127.0.0.1:6379"
    assert gateway.engines.asr.name == "ray"
    assert [(s.name, s.options["engine"]) for s in gateway.engines.tts] == [
        ("ray", "piper"),
        ("ray", "espeak"),
    ]
    assert gateway.engines.vad == settings.engines.vad  # VAD stays on the gateway
    assert gateway.engines.responder == settings.engines.responder
    width = settings.cluster.credits.max
    assert gateway.pipeline.asr.concurrency == gateway.pipeline.tts.concurrency == width
    enabled = settings.model_copy(
        update={"cluster": settings.cluster.model_copy(update={"enabled": True})}
    )
    assert with_cluster(enabled, None).engines.asr.name == "ray"


def test_an_address_nobody_answers_is_one_line_not_a_hang() -> None:
    """Ray retries an unreachable GCS for minutes, printing only warnings."""
    need_ray()
    port = free_port()  # nothing listens there
    started = time.monotonic()
    proc = voxserve("cluster", "status", "--address", f"127.0.0.1:{port}")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        f"voxserve: error: no Ray cluster answers at 127.0.0.1:{port} (Connection refused); "
        "start one with `voxserve cluster up` or set cluster.address (--address, --cluster)"
    ]
    assert time.monotonic() - started < 60


def test_ray_engines_refuse_without_the_gateway_settings() -> None:
    """`voxserve engines --load` builds every registered engine: the ray ones must refuse
    at once, not connect to whatever Ray cluster `auto` finds."""
    from voxserve.cluster.remote_asr import RemoteAsr
    from voxserve.cluster.remote_tts import RemoteTts

    with pytest.raises(ValueError, match="serve --cluster"):
        RemoteAsr()
    with pytest.raises(ValueError, match="serve --cluster"):
        RemoteTts(cluster={"address": "127.0.0.1:1"})


def test_cluster_up_refuses_a_local_cluster_too_small_for_its_replicas(tmp_path: Path) -> None:
    need_ray()
    config = tmp_path / "core.toml"
    config.write_text(LOAD_CORE)  # asr 0.25 CPU + tts 2 replicas x 1 CPU (the env)
    proc = voxserve(
        "cluster",
        "up",
        "--num-cpus",
        "1",
        "--config",
        str(config),
        VOXSERVE_CLUSTER__TTS__NUM_CPUS="1",
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("voxserve: error: the ASR and TTS replicas need 2.25 CPUs"), last

"""The `voxserve` command line, run as a real subprocess with the real engines.

Every error case must end as exactly one `voxserve: error: ...` line on stderr, a non-zero
exit code and no traceback; `serve` must say where to connect, become ready, and exit 0 on
SIGINT/SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import jiwer
import numpy as np
import pytest

from tests.helpers import free_port, reap, wait_ready
from voxserve.audio.wav import read_wav
from voxserve.cli.admin_http import url_host
from voxserve.config import ConfigError, load_settings

FIXTURES = Path(__file__).parent / "fixtures"
TEXT = "The weather today is sunny with a light breeze."
ENGINE_NAMES = ("silero", "whisper", "piper", "espeak", "echo", "rules", "openai")


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without VOXSERVE_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXSERVE_")}
    env.update(extra)
    return env


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    cwd: Path | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "voxserve", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env if env is not None else clean_env(),
        cwd=cwd,
        input=stdin,
        check=False,
    )


def assert_one_error_line(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("voxserve: error: "), line
    for needle in needles:
        assert needle in line, line
    return line


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


# --- help -----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [[], ["serve"], ["say"], ["transcribe"], ["engines"]])
def test_help_for_every_command(command: list[str]) -> None:
    proc = run_cli(*command, "--help", timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: voxserve {' '.join(command)}".rstrip())
    assert proc.stderr == ""
    if not command:
        for name in ("serve", "say", "transcribe", "engines"):
            assert name in proc.stdout


def test_bench_help_lists_its_subcommands() -> None:
    proc = run_cli("bench", "--help", timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: voxserve bench")
    for name in ("stream", "ramp", "tts", "sweep-chunk", "baseline", "engines"):
        assert re.search(rf"^\s+{name}\b", proc.stdout, re.MULTILINE), name
    assert "bench" in run_cli("--help", timeout=20).stdout


def test_bench_without_its_optional_packages() -> None:
    """Without matplotlib (blocked here), --help still works and bench names the extra."""
    blocked = "import sys; sys.modules['matplotlib'] = None; from voxserve.cli import main; "

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", blocked + "sys.exit(main())", *args],
            capture_output=True,
            text=True,
            timeout=20,
            env=clean_env(),
            check=False,
        )

    proc = run("--help")
    assert proc.returncode == 0 and "bench" in proc.stdout, proc.stderr
    proc = run("bench", "stream", "--help")
    assert proc.returncode == 0 and "--streams" in proc.stdout, proc.stderr
    # A run is refused before it starts, not after minutes of load at report time.
    proc = run("bench", "stream", "--url", "ws://127.0.0.1:9/v1/stream", "--duration", "1")
    assert_one_error_line(proc, "bench", "matplotlib", "pip install -e '.[dev]'")


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "voxserve"
    proc = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=20, check=False
    )
    assert proc.returncode == 0
    assert proc.stdout.strip().startswith("voxserve ")


def test_no_command_is_a_usage_error() -> None:
    proc = run_cli(timeout=20)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "required" in proc.stderr


# --- say and transcribe ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def spoken(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`voxserve say` once with real piper; later tests transcribe what it wrote."""
    out = tmp_path_factory.mktemp("say") / "out.wav"
    proc = run_cli("say", TEXT, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


def test_say_writes_a_wav_with_speech(spoken: tuple[Path, str]) -> None:
    path, stdout = spoken
    samples, rate = read_wav(path.read_bytes())
    assert rate == 16_000
    duration = samples.size / rate
    assert 1.5 < duration < 8.0
    rms = float(np.sqrt(np.mean(samples.astype(np.float64) ** 2)))
    assert rms > 300, "the WAV is (nearly) silent"
    assert str(path) in stdout
    assert f"{duration:.2f} s" in stdout
    assert re.search(r"first chunk after \d+ ms", stdout)


def test_say_from_stdin_with_rate_and_speed(tmp_path: Path, spoken: tuple[Path, str]) -> None:
    out = tmp_path / "fast.wav"
    proc = run_cli(
        "say", "-", "-o", str(out), "--sample-rate", "24000", "--speed", "1.5", stdin=TEXT
    )
    assert proc.returncode == 0, proc.stderr
    fast, rate = read_wav(out.read_bytes())
    normal, normal_rate = read_wav(spoken[0].read_bytes())
    assert rate == 24_000
    assert fast.size / rate < 0.85 * normal.size / normal_rate


def test_transcribe_recovers_the_spoken_words(spoken: tuple[Path, str]) -> None:
    path, _ = spoken
    proc = run_cli("transcribe", str(path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    # What is guaranteed: piper samples its noise per synthesis, so each `say` is another
    # recording. 30 syntheses of TEXT, tiny.en (2026-12-04): 9 exact, 21 with "the light
    # breeze" (one word, 0.11, tiny.en's own habit); CI once heard "water" besides (0.22).
    # One sentence is one draw: at most two of nine words off. (With piper's noise at 0 a
    # synthesis is the same every time; the engine has no option for it yet.)
    assert jiwer.wer(normalise(TEXT), normalise(body["text"])) <= 0.25, body["text"]
    assert body["segments"], body
    for seg in body["segments"]:
        assert 0 <= seg["start"] < seg["end"] <= body["duration_s"] + 0.5
        assert isinstance(seg["text"], str)


def test_transcribe_text_format_on_a_recording() -> None:
    expected = json.loads((FIXTURES / "fixtures.json").read_text())["lights.wav"]
    proc = run_cli("transcribe", str(FIXTURES / "lights.wav"), "--language", "en")
    assert proc.returncode == 0, proc.stderr
    assert jiwer.wer(normalise(expected), normalise(proc.stdout)) <= 0.25, proc.stdout
    assert len(proc.stdout.strip().splitlines()) == 1


# --- engines --------------------------------------------------------------------------------


def test_engines_lists_everything_with_versions_and_the_gpl_note() -> None:
    proc = run_cli("engines", timeout=30)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for kind in ("vad:", "asr:", "tts:", "responder:", "wake:"):
        assert kind in out
    for name in ENGINE_NAMES:
        assert re.search(rf"^  {name}\s+voxserve \d+\.\d+", out, re.M), name
    assert "loaded in" not in out  # no model was loaded
    assert re.search(r"piper-tts \d[\w.]* \(GPL-3\.0", out)
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert any("piper-tts" in n and "GPL-3.0" in n for n in notes), notes
    assert re.search(r"^  micro_wakeword\s+voxserve .*\[selected\]", out, re.M), out
    assert out.count("[selected]") == 6  # silero, whisper, piper, espeak, rules, wake


def test_engines_load_json() -> None:
    proc = run_cli("engines", "--load", "--json")
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    engines = body["engines"]
    assert set(engines) == {"vad", "asr", "tts", "responder", "wake"}
    names = {row["name"] for rows in engines.values() for row in rows}
    assert set(ENGINE_NAMES) <= names
    assert body["selected"]["tts"] == ["piper", "espeak"]
    for rows in engines.values():
        for row in rows:
            assert row["version"] and row["license"]
            if row["selected"]:
                loaded = row["loaded"]
                assert "error" not in loaded, loaded
                assert loaded["seconds"] >= 0 and loaded["version"]
    [piper] = [row for row in engines["tts"] if row["name"] == "piper"]
    assert "joe" in [voice["id"] for voice in piper["loaded"]["voices"]]
    assert "GPL-3.0" in piper["loaded"]["license"]
    [whisper] = [row for row in engines["asr"] if row["name"] == "whisper"]
    assert whisper["loaded"]["model"]
    [wake] = engines["wake"]
    assert (
        "okay_nabu" in wake["loaded"]["model"] and wake["loaded"]["package"] == "pymicro-wakeword"
    )
    assert any("piper-tts" in note and "GPL-3.0" in note for note in body["notes"])


# --- errors: one line, non-zero exit, no traceback ------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    proc = run_cli("transcribe", str(tmp_path / "nope.wav"))
    assert_one_error_line(proc, "nope.wav", "No such file")


def test_not_a_wav_file(tmp_path: Path) -> None:
    text = tmp_path / "notes.wav"
    text.write_text("this is not audio, just some text\n" * 4)
    proc = run_cli("transcribe", str(text))
    assert_one_error_line(proc, "invalid_audio")


def test_unknown_voice(tmp_path: Path) -> None:
    proc = run_cli("say", "hello", "-o", str(tmp_path / "x.wav"), "--voice", "nobody")
    assert_one_error_line(proc, "unknown_voice", "nobody", "joe")
    assert not (tmp_path / "x.wav").exists()


def test_bad_config_files(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[engines\nvad = ")
    proc = run_cli("say", "hi", "-o", str(tmp_path / "x.wav"), "--config", str(broken))
    assert_one_error_line(proc, "broken.toml", "not valid")
    assert proc.returncode == 2

    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"no_such_setting": 1}')
    proc = run_cli("engines", "--config", str(unknown))
    assert_one_error_line(proc, "no_such_setting")

    proc = run_cli("serve", "--config", str(tmp_path / "absent.toml"))
    assert_one_error_line(proc, "absent.toml")

    proc = run_cli("serve", "--port", "0", "--zeroconf-name", "two.labels")
    assert_one_error_line(proc, "--zeroconf-name", "without '.'")
    assert proc.returncode == 2


@pytest.mark.parametrize(
    ("variable", "value", "needle"),
    [
        ("VOXSERVE_PORT", "abc", "port"),
        ("VOXSERVE_LOG_LEVEL", "loud", "log_level"),
        ("VOXSERVE_ENGINES", "not json", "engines"),
    ],
)
def test_invalid_env_values(variable: str, value: str, needle: str) -> None:
    proc = run_cli("serve", env=clean_env(**{variable: value}), timeout=30)
    assert_one_error_line(proc, needle)
    assert proc.returncode == 2


def test_bad_say_options_fail_before_loading_models(tmp_path: Path) -> None:
    proc = run_cli("say", "hi", "-o", str(tmp_path / "x.wav"), "--speed", "9", timeout=20)
    assert_one_error_line(proc, "invalid_parameter", "speed")
    proc = run_cli("say", "hi", "-o", str(tmp_path / "x.wav"), "--sample-rate", "1234")
    assert_one_error_line(proc, "unsupported_sample_rate")
    proc = run_cli("say", "hi", "-o", str(tmp_path / "missing-dir" / "x.wav"))
    assert_one_error_line(proc, "missing-dir")
    proc = run_cli("say", "hi", "-o", str(tmp_path))  # found only after synthesis, before
    assert_one_error_line(proc, "is a directory", "-o")
    proc = run_cli("say", "hi", "-o", str(tmp_path / "x.wav"), "--sample-rate", "0")
    assert_one_error_line(proc, "unsupported_sample_rate")  # 0 meant the default


def test_port_in_use() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_cli("serve", "--port", str(port), timeout=30)
    assert_one_error_line(proc, f"port {port}", "already in use")
    assert proc.returncode == 2  # a configuration to change, as every bad setting


def test_engine_import_failure_names_the_extra(tmp_path: Path) -> None:
    """A missing optional package (here piper, shadowed by one that fails to import)."""
    fake = tmp_path / "shadow" / "piper"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'piper'\", name='piper')\n"
    )
    env = clean_env(PYTHONPATH=str(tmp_path / "shadow"))
    proc = run_cli("say", "hi", "-o", str(tmp_path / "x.wav"), env=env, timeout=30)
    assert_one_error_line(proc, "piper", "pip install -e '.[default]'")


def test_verbose_shows_the_traceback(tmp_path: Path) -> None:
    proc = run_cli("transcribe", str(tmp_path / "nope.wav"), "--verbose", timeout=20)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("voxserve: error: ")


# --- serve ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_serve_becomes_ready_and_stops_cleanly(tmp_path: Path, stop_signal: int) -> None:
    port, grpc_port, wyoming_port = free_port(), free_port(), free_port()
    transports = ["--grpc-port", str(grpc_port), "--wyoming-port", str(wyoming_port)]
    # Zeroconf is on by default: the Wyoming record is up while serving, gone after.
    name = f"voxserve-cli-{port}"
    transports += ["--zeroconf-name", name]
    browser = WyomingBrowser()
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voxserve", "serve", "--port", str(port), *transports],
            stdout=out,
            stderr=err,
            env=clean_env(),
        )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(proc, port, err_path, timeout_s=90)
        assert httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        # gRPC health turns SERVING as the runtime finishes loading, a moment after /readyz.
        serving_by = time.monotonic() + 5
        while not grpc_serving(f"127.0.0.1:{grpc_port}") and time.monotonic() < serving_by:
            time.sleep(0.1)
        assert grpc_serving(f"127.0.0.1:{grpc_port}")
        socket.create_connection(("127.0.0.1", wyoming_port), timeout=2).close()
        assert browser.port_of(name) == wyoming_port
        proc.send_signal(stop_signal)
        assert proc.wait(timeout=15) == 0, err_path.read_text()
        assert browser.gone(name), "no zeroconf goodbye at shutdown"
    finally:
        browser.close()
        reap(proc)

    stdout = out_path.read_text()
    assert stdout.splitlines()[0] == (
        f"voxserve listening on {base} (WebSocket ws://127.0.0.1:{port}/v1/stream, "
        f"OpenAI base_url {base}/v1); models loading, /readyz turns 200 when ready"
    )
    assert stdout.splitlines()[1:3] == [
        f"voxserve gRPC voxserve.v1 on 127.0.0.1:{grpc_port} (plaintext; health and "
        "reflection included)",
        f"voxserve Wyoming on tcp://127.0.0.1:{wyoming_port} (plain TCP)",
    ]
    records = [json.loads(line) for line in err_path.read_text().splitlines() if line.strip()]
    assert records, "no log lines"
    for record in records:
        assert {"ts", "level", "logger", "msg"} <= set(record)
    ready_lines = [r for r in records if r["msg"] == "models loaded; ready"]
    assert len(ready_lines) == 1 and ready_lines[0]["seconds"] > 0
    assert "tts.piper" in ready_lines[0]["load_seconds"]
    assert any(r["logger"].startswith("uvicorn") for r in records)  # routed through ours


def test_serve_stopped_while_its_models_load_exits_at_once(tmp_path: Path) -> None:
    """A TTS engine that takes a minute to load (the `load` engine's load_ms): SIGTERM
    while it loads ends the server in seconds (it waited for the load to finish)."""
    port = free_port()
    env = clean_env(VOXSERVE_ENGINES__TTS='[{"name": "load", "options": {"load_ms": 60000}}]')
    config = Path(__file__).parent.parent / "bench" / "load-engines.toml"
    err_path = tmp_path / "stderr"
    command = [sys.executable, "-m", "voxserve", "serve", "--config", str(config)]
    command += ["--port", str(port), "--grpc-port", "0", "--wyoming-port", "0"]
    with err_path.open("w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 503:
                    break  # up, and loading
            time.sleep(0.2)
        assert proc.poll() is None, err_path.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, err_path.read_text()
    finally:
        reap(proc)


class WyomingBrowser:
    """A zeroconf browser of `_wyoming._tcp.local.` on the loopback (its own threads)."""

    def __init__(self) -> None:
        from zeroconf import IPVersion, ServiceBrowser, Zeroconf

        self.zeroconf = Zeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
        self.removed: set[str] = set()
        self.browser = ServiceBrowser(self.zeroconf, "_wyoming._tcp.local.", handlers=[self._on])

    def _on(self, zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
        if state_change.name == "Removed":
            self.removed.add(name)

    def port_of(self, name: str) -> int | None:
        info = self.zeroconf.get_service_info(
            "_wyoming._tcp.local.", f"{name}._wyoming._tcp.local.", timeout=5000
        )
        return None if info is None else info.port

    def gone(self, name: str) -> bool:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if f"{name}._wyoming._tcp.local." in self.removed:
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self.browser.cancel()
        self.zeroconf.close()


def grpc_serving(target: str) -> bool:
    """The standard health check of a voxserve gRPC port says SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def test_grpc_port_in_use() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_cli("serve", "--port", str(free_port()), "--grpc-port", str(port), timeout=30)
    assert_one_error_line(proc, f"gRPC port {port}", "--grpc-port 0")


def test_tls_needs_both_files(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("not used")
    proc = run_cli("serve", "--port", str(free_port()), "--tls-cert", str(cert), timeout=30)
    assert_one_error_line(proc, "TLS needs both")
    assert proc.returncode == 2


def test_tls_files_that_are_not_a_pem_pair_stop_serve_before_it_listens(tmp_path: Path) -> None:
    """They failed with an SSLError traceback after "listening on"."""
    text = tmp_path / "notes.txt"
    text.write_text("not a certificate")
    flags = ("--tls-cert", str(text), "--tls-key", str(text))
    proc = run_cli("serve", "--port", str(free_port()), *flags, timeout=30)
    assert_one_error_line(proc, "notes.txt", "PEM pair")
    assert proc.returncode == 2 and "listening" not in proc.stdout


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (("--port", "70000"), "port"),  # it listened on 70000 - 65536 = 4464
        (("--workers", "500"), "workers"),  # it forked 500 workers
        (("--workers", "0"), "workers"),
        (("--tracemalloc", "-1"), "tracemalloc_frames"),  # a ValueError after "listening"
    ],
)
def test_flags_are_checked_like_the_settings_they_set(flags: tuple[str, ...], needle: str) -> None:
    proc = run_cli("serve", *flags, timeout=30)
    assert_one_error_line(proc, f"invalid setting {needle}")
    assert proc.returncode == 2 and "listening" not in proc.stdout


@pytest.mark.parametrize("origin", ["not an origin", "https://app.example.com/app"])
def test_a_cors_origin_that_is_not_one_is_refused(origin: str) -> None:
    """A browser's Origin has no path: such an entry never matched (a trailing slash is
    taken, as the origin check ignores it)."""
    proc = run_cli("serve", "--port", "0", "--cors-origin", origin, timeout=30)
    assert_one_error_line(proc, "--cors-origin", "scheme://host[:port]")
    assert proc.returncode == 2
    env = clean_env(VOXSERVE_CORS_ALLOWED_ORIGINS=json.dumps([origin]))
    proc = run_cli("serve", "--port", "0", env=env, timeout=30)
    assert_one_error_line(proc, "invalid setting cors_allowed_origins", "is not an origin")


def test_a_flag_still_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXSERVE_PORT", "9001")
    monkeypatch.setenv("VOXSERVE_WORKERS", "3")
    settings = load_settings(None, port=9002)
    assert (settings.port, settings.workers) == (9002, 3)


def test_a_misspelt_key_in_a_table_names_the_valid_ones(tmp_path: Path) -> None:
    """`[limits] max_sesions = 5` loaded with the default, silently."""
    config = tmp_path / "voxserve.toml"
    config.write_text('[limits]\nmax_sesions = 5\n\n[engines.asr]\nname = "whisper"\n')
    proc = run_cli("engines", "--config", str(config), timeout=30)
    assert_one_error_line(proc, "unknown setting limits.max_sesions", "max_sessions")
    assert proc.returncode == 2
    for data, needle in (
        ({"engines": {"asr": {"name": "whisper", "model": "base"}}}, "engines.asr.model"),
        ({"flow": {"credit_windoww": 3}}, "flow.credit_windoww"),
        ({"engines": {"tts": [{"name": "piper", "voice": "joe"}]}}, "engines.tts.0.voice"),
    ):
        path = tmp_path / "settings.json"
        path.write_text(json.dumps(data))
        with pytest.raises(ConfigError, match=f"unknown setting {needle}; valid keys there"):
            load_settings(path)


def test_a_config_file_that_is_not_text_is_one_line(tmp_path: Path) -> None:
    binary = tmp_path / "voxserve.toml"
    binary.write_bytes(b"\xd0\xff\x00")
    proc = run_cli("engines", "--config", str(binary), timeout=30)
    assert_one_error_line(proc, "voxserve.toml", "not UTF-8")
    assert proc.returncode == 2


@pytest.mark.parametrize(
    ("package", "name", "flag"),
    [("grpc", "gRPC", "--grpc-port"), ("wyoming", "Wyoming", "--wyoming-port")],
)
def test_transport_without_its_extra_names_what_to_install(
    tmp_path: Path, package: str, name: str, flag: str
) -> None:
    fake = tmp_path / "shadow" / package
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{package}'\", name='{package}')\n"
    )
    env = clean_env(PYTHONPATH=str(tmp_path / "shadow"))
    ports = ["--grpc-port", str(free_port()), "--wyoming-port", str(free_port())]
    proc = run_cli("serve", "--port", str(free_port()), *ports, env=env, timeout=30)
    assert_one_error_line(proc, f"the {name} transport", "pip install -e '.[grpc]'", f"{flag} 0")


def test_transports_off_need_no_grpc_packages() -> None:
    """`pip install -e .` without the extra: ports 0 import nothing of gRPC or Wyoming."""
    script = (
        "import sys\n"
        "for name in ('grpc', 'wyoming', 'google.protobuf'): sys.modules[name] = None\n"
        "from voxserve.config import load_settings\n"
        "from voxserve.server.app import create_app\n"
        "from voxserve.server.transports import check_transport_packages\n"
        "from voxserve.cli.app import main\n"
        "settings = load_settings(grpc_port=0, wyoming_port=0)\n"
        "check_transport_packages(settings)\n"
        "print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_admin_commands_reach_an_ipv6_server() -> None:
    """`cache stats` with host ::1 built http://::1:8000 (InvalidURL)."""
    assert [url_host(h) for h in ("::1", "::", "0.0.0.0", "", "10.0.0.2")] == [
        "[::1]",
        "[::1]",
        "127.0.0.1",
        "127.0.0.1",
        "10.0.0.2",
    ]

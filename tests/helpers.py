"""Helpers shared by end-to-end tests: fixtures on disk and word error rate."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import jiwer
import numpy as np
import openai

from voxserve.audio.wav import read_wav
from voxserve.config import Settings

if TYPE_CHECKING:
    from openai.resources.realtime.realtime import AsyncRealtimeConnection
    from openai.types.realtime import ClientSecretCreateResponse

    from tests.conftest import LiveServer

FIXTURES = Path(__file__).parent / "fixtures"


def settings_with(settings: Settings, **changes: Any) -> Settings:
    """A copy of `settings`: a dict given for a section updates those of its fields
    (`limits={"idle_timeout_s": 1.0}`), any other value replaces the field."""
    update = {
        name: getattr(settings, name).model_copy(update=value) if isinstance(value, dict) else value
        for name, value in changes.items()
    }
    return settings.model_copy(update=update)


def fixture_texts() -> dict[str, str]:
    data: dict[str, str] = json.loads((FIXTURES / "fixtures.json").read_text())
    return data


def fixture_audio(name: str) -> np.ndarray:
    samples, rate = read_wav((FIXTURES / name).read_bytes())
    assert rate == 16_000
    return samples


_SPOKEN: dict[str, np.ndarray] = {}


def spoken(runtime: Any, text: str, pad_s: float = 0.5) -> np.ndarray:
    """`text` in the server's own `joe` voice (piper), 16 kHz int16, `pad_s` of silence
    before and after: wake words said by the server's TTS, no recording needed."""
    if text not in _SPOKEN:
        import soxr

        _, engine = runtime.engines.voice("joe")
        audio = np.concatenate(list(engine.synthesize(text, voice="joe"))).astype(np.float32)
        audio = soxr.resample(audio / 32768.0, engine.sample_rate, 16_000)
        _SPOKEN[text] = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    pad = np.zeros(int(pad_s * 16_000), dtype=np.int16)
    return np.concatenate([pad, _SPOKEN[text], pad])


_NUMBER_WORDS = {
    word: str(value)
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen"
        " fourteen fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate after lower-casing, dropping punctuation and writing small numbers
    as digits (Whisper writes "5" or "five" for the same audio, run to run)."""

    def clean(text: str) -> str:
        words = re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()
        return " ".join(_NUMBER_WORDS.get(word, word) for word in words)

    return float(jiwer.wer(clean(reference), clean(hypothesis) or "<empty>"))


async def eventually(check: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Poll `check` until it is true (server state read from the test's side)."""
    async with asyncio.timeout(timeout_s):
        while not check():  # noqa: ASYNC110 (a test poll of another thread's state)
            await asyncio.sleep(0.02)


async def sessions_ended(runtime: Any) -> None:
    """Until no session is live on `runtime`. A connection's per-connection metrics are added
    when it ends, and an earlier test's connection may still be ending: read a "before"
    figure after this (one such late count landed in the next test's figures in CI)."""
    await eventually(lambda: runtime.active_sessions == 0)


# --- the `openai` SDK's async client -----------------------------------------------------------
# Each is closed by the test that made it, while its loop runs. One left open sits in a reference
# cycle until the cyclic GC frees it, at any later moment: maybe in another test's loop, where its
# `__del__` schedules `aclose()`, which fails on the old loop's connections ("Task exception was
# never retrieved ... Event loop is closed", an error record a later test caught in CI).


@asynccontextmanager
async def async_sdk(
    live: LiveServer, key: str, **options: Any
) -> AsyncIterator[openai.AsyncOpenAI]:
    """An `openai.AsyncOpenAI` client of `live` (no retries, `options` besides), closed after."""
    async with openai.AsyncOpenAI(
        base_url=f"{live.http_url}/v1", api_key=key, max_retries=0, **options
    ) as client:
        yield client


@asynccontextmanager
async def realtime_connection(
    live: LiveServer, key: str, **connect: Any
) -> AsyncIterator[AsyncRealtimeConnection]:
    """`client.realtime.connect(**connect)` on an `async_sdk` client of its own; the connection
    closed after, then the client."""
    async with async_sdk(live, key) as client, client.realtime.connect(**connect) as conn:
        yield conn


async def mint_client_secret(
    live: LiveServer, key: str, **create: Any
) -> ClientSecretCreateResponse:
    """`client.realtime.client_secrets.create(**create)` on an `async_sdk` client of its own."""
    async with async_sdk(live, key) as client:
        return await client.realtime.client_secrets.create(**create)


def wait_ready(
    proc: subprocess.Popen[bytes],
    port: int,
    log: Path,
    timeout_s: float = 60.0,
    workers: int = 1,
) -> None:
    """Wait until a `voxserve serve` subprocess answers /readyz 200; fail with its log if it
    exits or does not get ready in time. With `workers` > 1 the kernel hands each new
    connection to any worker, and one ready worker says nothing of the others: 20 answers
    200 in a row on new connections (a worker still loading would be missed by all 20 with
    odds of 2^-20 for two workers)."""
    deadline = time.monotonic() + timeout_s
    in_a_row = 0
    while True:
        try:
            ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            ready = False
        in_a_row = in_a_row + 1 if ready else 0
        if in_a_row >= (1 if workers <= 1 else 20):
            return
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the server did not get ready"
        time.sleep(0.1 if not ready else 0.0)


def tts_calls_after_disconnect(base_url: str, stage: Any, body: dict[str, Any]) -> tuple[int, int]:
    """POST /v1/audio/speech, leave after its first bytes, wait until the TTS stage settles:
    (the stage's calls when it settled, its calls half a second later)."""
    with (
        httpx.Client(base_url=base_url, timeout=60) as http,
        http.stream("POST", "/v1/audio/speech", json=body) as response,
    ):
        assert response.status_code == 200
        next(response.iter_raw())
    deadline = time.monotonic() + 5
    while (stage.running or stage.waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    settled = stage.calls
    time.sleep(0.5)
    return settled, stage.calls


class PeakConcurrency:
    """Work that lasts `seconds` and counts the callers inside it at once: `peak` is the
    most there ever were (what a concurrency bound is checked by). Returns 1."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.active = 0
        self.peak = 0
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(self.seconds)
        with self._lock:
            self.active -= 1
        return 1


class ErrorRecords(logging.Handler):
    """Error records of any logger while installed (asyncio's "never retrieved", grpc's
    "raised in core", aiortc's tasks): hostile tests assert there are none."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM (a server's graceful drain), then SIGKILL if it has not exited in time."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill `proc` if it still runs (what a failed test leaves behind) and wait for it."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (outgoing connections' local ports)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports tests listen on: above Ray's worker ports (10002-19999) and below the ephemeral
# range, split between the xdist workers. A port bound to 0 and released comes from the
# ephemeral range, where any process's outgoing connection (or another worker's pick) could
# take it before the server binds it: CI saw "address already in use" for such a port.
_PORTS_FROM = 20_000
_port_cursor: int | None = None


def free_port() -> int:
    """A loopback port free just now, that nothing else in this run picks: this worker's
    own slice of [20000, ephemeral range), the next one there that binds."""
    global _port_cursor
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    size = (_ephemeral_low() - _PORTS_FROM) // max(count, 1)
    low = _PORTS_FROM + index * size
    if _port_cursor is None:
        _port_cursor = os.getpid() % size  # a rerun in the same second starts elsewhere
    for _ in range(size):
        port = low + _port_cursor % size
        _port_cursor += 1
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{low + size - 1}")


def start_serve(env: dict[str, str], log: Path, *flags: str) -> tuple[subprocess.Popen[bytes], int]:
    """`voxserve serve` on a free loopback port (gRPC and Wyoming off, `flags` after), its
    output in `log`: the process and its port (then `wait_ready`, `stop_process`)."""
    port = free_port()
    cmd = [sys.executable, "-m", "voxserve", "serve", "--port", str(port)]
    cmd += ["--grpc-port", "0", "--wyoming-port", "0", *flags]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    return proc, port


@contextmanager
def serving(env: dict[str, str], log: Path, *flags: str) -> Iterator[str]:
    """`start_serve`, ready: its base URL (http://127.0.0.1:PORT); stopped after."""
    proc, port = start_serve(env, log, *flags)
    try:
        wait_ready(proc, port, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


@contextmanager
def http_standin(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on a free loopback port in a thread (a stand-in remote engine): its
    OpenAI-style base URL (`.../v1`), the server shut down after."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()

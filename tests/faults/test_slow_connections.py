"""Slow and idle HTTP connections on real sockets: every way of holding a request open
(silence, headers cut or trickled, a body cut or paused, a chunked upload cut, the rest of a
body nobody reads) is answered 408 `client_stalled` and closed within its limit
(`limits.http_header_timeout_s`, `limits.http_body_timeout_s`); a response the client
never reads is aborted after `limits.stalled_client_s`; and a `voxserve serve` process
with 400 descriptors keeps answering /healthz under 420 such connections, closing them."""

from __future__ import annotations

import os
import re
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeTts, fake_runtime
from tests.helpers import settings_with, wait_ready
from voxserve.config import load_settings
from voxserve.server.http.protocol import default_max_connections

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
HEADER_S = 1.0
BODY_S = 1.0
STALL_S = 1.5


@pytest.fixture(scope="module")
def slow_server() -> Iterator[LiveServer]:
    limits = {
        "http_header_timeout_s": HEADER_S,
        "http_body_timeout_s": BODY_S,
        "stalled_client_s": STALL_S,
    }
    settings = settings_with(
        load_settings(port=free_port(), log_level="warning"),
        limits=limits,
        cache={"enabled": False},
    )
    live = start_server(settings, fake_runtime(settings, tts=FakeTts(seconds_per_word=0.2)))
    yield live
    stop_server(live)


def _json_request(path: str, length: int, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    return head.encode() + body


def _chunked_upload(cut: bytes) -> bytes:
    head = (
        b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Transfer-Encoding: chunked\r\n"
        b"Content-Type: multipart/form-data; boundary=b\r\n\r\n"
    )
    part = b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF'
    return head + b"%x\r\n" % len(part) + part + b"\r\n" + cut


# name: (bytes sent at once, bytes then trickled one every 0.2 s, the limit that ends it,
# the first status answered; the last is always 408)
CASES: dict[str, tuple[bytes, bytes, float, int]] = {
    "silent": (b"", b"", HEADER_S, 408),
    "headers cut": (b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Le", b"", HEADER_S, 408),
    "headers trickled": (b"GET /healthz HTTP/1.1\r\n", b"X-Slow: " + b"a" * 40, HEADER_S, 408),
    "json body cut": (_json_request("/v1/audio/speech", 200, b'{"input": "hel'), b"", BODY_S, 408),
    "chunked upload cut": (_chunked_upload(b"10\r\nabc"), b"", BODY_S, 408),
    "chunked upload paused": (_chunked_upload(b""), b"", BODY_S, 408),
    # 405 at once, without reading the body; its rest never comes: due like headers.
    "unread body cut": (_json_request("/healthz", 100, b"{}"), b"", HEADER_S, 405),
    # Keep-alive: the first request answered, the next one's headers cut.
    "next headers cut": (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /he", b"", HEADER_S, 200),
}


def _held_open(live: LiveServer, first: bytes, trickle: bytes) -> tuple[bytes, float]:
    """Send `first`, then `trickle` a byte at a time, and read until the server closes:
    (what it answered, seconds it took)."""
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", live.settings.port)) as sock:
        sock.sendall(first)
        sock.settimeout(0.2)
        answer = b""
        pending = list(trickle)
        while time.monotonic() - began < 10:
            if pending:
                try:
                    sock.send(bytes([pending.pop(0)]))
                except OSError:
                    pending = []
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
    return answer, time.monotonic() - began


@pytest.mark.parametrize("case", list(CASES))
def test_a_request_held_open_is_answered_and_closed_in_time(
    slow_server: LiveServer, case: str
) -> None:
    first, trickle, limit, status = CASES[case]
    answer, took = _held_open(slow_server, first, trickle)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    last = answer[answer.rindex(b"HTTP/1.1 ") :]
    assert last.startswith(b"HTTP/1.1 408 "), answer
    assert b'"code":"client_stalled"' in last.replace(b" ", b"")
    assert re.search(rb"\r\nx-request-id: [0-9a-f]{16}\r\n", last), last  # made below the app
    assert limit * 0.9 <= took <= limit + 1.5, took


def test_a_response_nobody_reads_is_aborted(slow_server: LiveServer) -> None:
    """Speech of 800 words (160 s of audio, made at once) asked for and never read: the
    server's buffers fill, and the connection is aborted `stalled_client_s` later."""
    registry = slow_server.runtime.metrics.registry

    def aborted() -> float:
        labels = {"reason": "unread_response"}
        return registry.get_sample_value("voxserve_http_connections_closed_total", labels) or 0

    before = aborted()
    body = b'{"input": "%s", "response_format": "pcm"}' % (b"word " * 800)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", slow_server.settings.port))
        sock.sendall(_json_request("/v1/audio/speech", len(body), body))
        began = time.monotonic()
        while aborted() == before:
            assert time.monotonic() - began < 15, "never aborted"
            time.sleep(0.05)
        assert time.monotonic() - began >= STALL_S


# -- descriptors ---------------------------------------------------------------------------

NOFILE = 400
HELD = 420


# `python -m voxserve` with its descriptors limited first (not preexec_fn: the test process
# runs server threads, and a fork with threads may not run Python code safely).
LIMITED_VOXSERVE = (
    "import resource, runpy, sys; "
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({NOFILE}, {NOFILE})); "
    "sys.argv[0] = 'voxserve'; runpy.run_module('voxserve', run_name='__main__')"
)


@pytest.fixture
def small_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """`voxserve serve` (load engines) in a process with 400 descriptors, 2 s header and
    body timeouts."""
    port = free_port()
    env = {
        **os.environ,
        "VOXSERVE_LIMITS__HTTP_HEADER_TIMEOUT_S": "2",
        "VOXSERVE_LIMITS__HTTP_BODY_TIMEOUT_S": "2",
        "VOXSERVE_CACHE__ENABLED": "false",
    }
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", LIMITED_VOXSERVE, "serve", "--config",
             "bench/load-engines.toml", "--port", str(port), "--grpc-port", "0",
             "--wyoming-port", "0", "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_ready(proc, port, log)
        yield proc, port
    finally:
        proc.kill()
        proc.wait()


def _stuck(kind: int) -> bytes:
    """Three kinds of request that never complete: headers, a JSON body, a chunked upload."""
    return [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
        _json_request("/v1/audio/speech", 500, b'{"input": '),
        _chunked_upload(b"20\r\nab"),
    ][kind % 3]


def _metric(port: int, sample: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    values = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(sample)]
    return float(values[0]) if values else 0.0


def _open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0)
    try:
        while data := sock.recv(65536):
            del data
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


def test_healthz_answers_with_420_stuck_connections_and_400_descriptors(
    small_server: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, port = small_server
    limits = Path(f"/proc/{proc.pid}/limits").read_text()
    assert any(
        line.startswith("Max open files") and line.split()[3:5] == [str(NOFILE)] * 2
        for line in limits.splitlines()
    ), limits
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < HELD + 200:  # this process holds the client ends
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, HELD + 400), hard))
    socks: list[socket.socket] = []
    try:
        for i in range(HELD):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(_stuck(i))
            socks.append(sock)
        began = time.monotonic()
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert health.status_code == 200
        assert time.monotonic() - began < 2
        assert _open_descriptors(proc.pid) < NOFILE
        # Over the cap (400 less its headroom) the oldest stuck ones made room.
        evicted = _metric(port, 'voxserve_http_connections_closed_total{reason="evicted"}')
        assert evicted >= HELD - default_max_connections(NOFILE)
        # Every stuck connection is closed: evicted to make room, or at its timeout (2 s).
        deadline = time.monotonic() + 10
        while not all(_closed_by_server(s) for s in socks):
            assert time.monotonic() < deadline, "stuck connections left open"
            time.sleep(0.1)
        assert proc.poll() is None
    finally:
        for sock in socks:
            sock.close()

"""Hostile Host headers: the DNS-rebinding door (issue 35, finding 3), on a real server.

A page at `http://evil.example:8000` whose name is re-pointed at 127.0.0.1 sends
`Origin` and `Host` both `evil.example:8000`; the Origin check alone took that for the
server's own page. Generated and tabled Host values (rebinding names, IP literals, IPv6,
ports, case, trailing dots, none, two, overlong, garbage) against every route class:
speech, transcriptions, client secrets, WebRTC calls, the page, and the /v1/stream and
/v1/realtime WebSockets, through raw sockets (any bytes), httpx and websockets (a real
client handed a socket to 127.0.0.1 under a foreign name: a rebinding, without DNS). The
health routes answer any Host; the openai SDK is unaffected; `allowed_hosts` admits."""

from __future__ import annotations

import asyncio
import contextlib
import io
import ipaddress
import itertools
import json
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeTts, fake_runtime, tone
from tests.hostile.watch import watched
from voxserve.audio.wav import write_wav
from voxserve.config import Settings, load_settings
from voxserve.server.host_guard import HostRule, host_of

pytestmark = pytest.mark.timeout(120)

ALLOWED = ["voice.example.com", "*.lan.example"]
EVIL = "evil.example"
REFUSED_HOSTS: list[bytes] = [
    b"evil.example",
    b"evil.example:8000",
    b"EVIL.Example:8000",
    b"evil.example.",
    b"localhost.evil.example",
    b"127.0.0.1.evil.example",
    b"lan.example",  # *.lan.example is its sub-domains only
    b"voice.example.com.evil.example",
    b"xvoice.example.com",
    b"10.0.0.1",
    b"192.168.1.5:8000",
    b"0.0.0.0:8000",  # "0.0.0.0 day": browsers reached local servers through it
    b"127.000.000.001",
    b"2130706433",
    b"0x7f.0.0.1",
    b"[2001:db8::1]:8000",
    b"[::ffff:10.0.0.1]",
    b"[::]",
    b"::1",  # IPv6 without its brackets
    b"[::1",
    b"[::1]x",
    b"localhost:8000:1",
    b"localhost:port",
    b"127.0.0.1@evil.example",
    b"evil.example#127.0.0.1",
    b"local host",
    b"",
    b"l\xc3\xb3calhost",
    b"x" * 400,
    b"a." * 200 + b"localhost",
]
ADMITTED_HOSTS: list[bytes] = [
    b"127.0.0.1",
    b"127.0.0.1:8000",
    b"127.9.9.9:1",
    b"localhost",
    b"LocalHost:8000",
    b"localhost.",
    b"localhost:",
    b"[::1]",
    b"[::1]:8000",
    b"[0:0:0:0:0:0:0:1]",
    b"[::ffff:127.0.0.1]:8000",
    b"voice.example.com",
    b"VOICE.Example.COM.:443",
    b"a.lan.example",
    b"b.c.lan.example:9",
]
ROUTES = ["speech", "transcriptions", "client_secrets", "calls", "page", "models"]
WS_ROUTES = ["/v1/stream", "/v1/realtime"]
_words = (f"hostword{n}" for n in itertools.count())


def _server(**update: object) -> LiveServer:
    settings = load_settings(port=free_port(), log_level="warning")
    settings = settings.model_copy(update=update)
    return start_server(settings, fake_runtime(settings, tts=FakeTts()))


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = _server(allowed_hosts=ALLOWED)
    yield live
    stop_server(live)


def _wav() -> bytes:
    return write_wav(tone(440, 0.5).astype(np.int16), 16_000)


def _request(route: str, hosts: list[bytes], word: str, origin: str | None = None) -> bytes:
    """One raw HTTP/1.1 request of the route class with exactly these Host lines."""
    method, path, kind, body = {
        "speech": ("POST", "/v1/audio/speech", "application/json", b""),
        "transcriptions": ("POST", "/v1/audio/transcriptions", "multipart/form-data", b""),
        "client_secrets": ("POST", "/v1/realtime/client_secrets", "application/json", b"{}"),
        "calls": ("POST", "/v1/realtime/calls", "application/sdp", b"v=0\r\n"),
        "page": ("GET", "/", "", b""),
        "models": ("GET", "/v1/models", "", b""),
    }[route]
    if route == "speech":
        body = json.dumps({"input": word, "voice": "fake"}).encode()
    if route == "transcriptions":
        kind += "; boundary=b"
        body = (
            b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            b"Content-Type: audio/wav\r\n\r\n" + _wav() + b"\r\n--b--\r\n"
        )
    head = [f"{method} {path} HTTP/1.1".encode()]
    head += [b"Host: " + host for host in hosts]
    if origin is not None:
        head.append(f"Origin: {origin}".encode())
    if body:
        head += [f"Content-Type: {kind}".encode(), f"Content-Length: {len(body)}".encode()]
    head.append(b"Connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def _exchange(port: int, request: bytes, read_s: float = 5.0) -> bytes:
    """Send `request`, read until the server closes (or `read_s` passes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_s) as sock:
        sock.sendall(request)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            pass
    return answer


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.") else 0


def _code(answer: bytes) -> str | None:
    _, _, body = answer.partition(b"\r\n\r\n")
    try:
        return str(json.loads(body)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


def _assert_refused(answer: bytes, what: object) -> None:
    """403 `host_not_allowed`, or (bytes no HTTP parser takes: NUL, a bare CR) the parser's
    400; never served, never a 5xx."""
    status, code = _status(answer), _code(answer)
    assert (status, code) in ((400, None), (403, "host_not_allowed")), (what, answer[:300])


@pytest.mark.parametrize("route", ROUTES)
def test_foreign_hosts_are_refused_on_every_route_before_any_work(
    server: LiveServer, route: str
) -> None:
    tts = server.runtime.engines.tts[0]
    assert isinstance(tts, FakeTts)
    for host in REFUSED_HOSTS:
        word = next(_words)
        answer = _exchange(server.settings.port, _request(route, [host], word))
        _assert_refused(answer, host)
        assert not [call for call in tts.calls if word in call], host


@pytest.mark.parametrize("route", ROUTES)
def test_loopback_the_configured_and_allowed_hosts_reach_the_route(
    server: LiveServer, route: str
) -> None:
    for host in ADMITTED_HOSTS:
        answer = _exchange(server.settings.port, _request(route, [host], next(_words)))
        # The route's own answer: calls refuses the toy offer (400 invalid_sdp).
        expected = 400 if route == "calls" else 200
        assert _status(answer) == expected, (host, answer[:300])
        assert _code(answer) != "host_not_allowed"


@pytest.mark.parametrize(
    "hosts",
    [
        [b"localhost", b"evil.example"],
        [b"evil.example", b"localhost"],
        [b"127.0.0.1", b"127.0.0.1"],
        [b"localhost", b""],
    ],
)
@pytest.mark.parametrize("route", ["speech", "client_secrets"])
def test_two_host_headers_are_refused(server: LiveServer, route: str, hosts: list[bytes]) -> None:
    answer = _exchange(server.settings.port, _request(route, hosts, next(_words)))
    _assert_refused(answer, hosts)


def test_a_request_without_host_is_no_browsers_and_is_served(server: LiveServer) -> None:
    """HTTP/1.0 carries no Host; every browser sends one, so no page sent this."""
    answer = _exchange(server.settings.port, b"GET /v1/models HTTP/1.0\r\n\r\n")
    assert _status(answer) == 200, answer[:300]
    body = json.dumps({"input": next(_words), "voice": "fake"}).encode()
    speech = b"POST /v1/audio/speech HTTP/1.0\r\nContent-Type: application/json\r\n"
    speech += f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    assert _status(_exchange(server.settings.port, speech)) == 200


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_health_and_metrics_answer_any_host(server: LiveServer, path: str) -> None:
    """A Kubernetes probe sends the pod's IP, a scraper a service name: nothing acts."""
    for host in [b"10.1.2.3:8000", b"voxserve.default.svc.cluster.local", b"evil.example"]:
        request = f"GET {path} HTTP/1.1\r\nConnection: close\r\n".encode()
        answer = _exchange(server.settings.port, request + b"Host: " + host + b"\r\n\r\n")
        assert _status(answer) == 200, (host, answer[:200])


_label = st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True)
_name = st.lists(_label, min_size=1, max_size=4).map(".".join)
_cased = st.tuples(_name, st.booleans(), st.booleans()).map(
    lambda t: (t[0].upper() if t[1] else t[0]) + ("." if t[2] else "")
)
_port = st.one_of(st.just(""), st.integers(0, 65535).map(lambda p: f":{p}"))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=_cased, port=_port)
def test_generated_names_are_refused_unless_allowed(
    server: LiveServer, name: str, port: str
) -> None:
    bare = name.lower().removesuffix(".")
    allowed = bare in ("localhost", "voice.example.com") or bare.endswith(".lan.example")
    with contextlib.suppress(ValueError):
        allowed = allowed or ipaddress.IPv4Address(bare).is_loopback
    url = f"{server.http_url}/v1/models"
    response = httpx.get(url, headers={"Host": name + port}, timeout=5)
    if allowed:
        assert response.status_code == 200
    else:
        assert response.status_code == 403, name + port
        assert response.json()["error"]["code"] == "host_not_allowed"


# -- WebSockets ----------------------------------------------------------------------------


def _ws_handshake(path: str, hosts: list[bytes], origin: str | None = None) -> bytes:
    lines = [f"GET {path} HTTP/1.1".encode(), *(b"Host: " + h for h in hosts)]
    lines += [
        b"Upgrade: websocket",
        b"Connection: Upgrade",
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        b"Sec-WebSocket-Version: 13",
    ]
    if origin is not None:
        lines.append(f"Origin: {origin}".encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _ws_exchange(port: int, request: bytes, *, head_only: bool = False) -> bytes:
    """Send a handshake, read until its refusal is whole: the answer's head when it is not
    an upgrade (or `head_only`), else up to the server's close frame."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            head, done, rest = answer.partition(b"\r\n\r\n")
            if done and (head_only or not head.startswith(b"HTTP/1.1 101")):
                return answer
            if done and any(opcode == 8 for opcode, _ in _frames(rest)):
                return answer
    return answer


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    """The (opcode, payload) of the server's unmasked frames in `data`."""
    frames: list[tuple[int, bytes]] = []
    while len(data) >= 2:
        opcode, size, at = data[0] & 0x0F, data[1] & 0x7F, 2
        if size == 126:
            size, at = int.from_bytes(data[2:4], "big"), 4
        elif size == 127:
            size, at = int.from_bytes(data[2:10], "big"), 10
        if len(data) < at + size:
            break
        frames.append((opcode, data[at : at + size]))
        data = data[at + size :]
    return frames


def _ws_refusal(answer: bytes) -> tuple[str | None, int | None]:
    """From a raw handshake's answer: the code of the error event and the close code."""
    head, _, rest = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        return _code(answer), None
    code, close = None, None
    for opcode, payload in _frames(rest):
        if opcode == 1:
            event = json.loads(payload)
            code = event.get("code") or event.get("error", {}).get("code")
        if opcode == 8:
            close = int.from_bytes(payload[:2], "big")
    return code, close


@pytest.mark.parametrize("path", WS_ROUTES)
def test_foreign_hosts_are_refused_on_the_websockets(server: LiveServer, path: str) -> None:
    """Accepted, one `error` event `host_not_allowed` in the route's protocol, close 1008:
    what a foreign Origin gets. Bytes the handshake parser refuses never open at all."""
    for host in [*REFUSED_HOSTS, b"localhost\r\nHost: evil.example"]:
        answer = _ws_exchange(server.settings.port, _ws_handshake(path, [host]))
        code, close = _ws_refusal(answer)
        if close is None:  # refused by the handshake's parser: never upgraded
            assert 400 <= _status(answer) < 500, (host, answer[:200])
            continue
        assert (code, close) == ("host_not_allowed", 1008), (host, answer[:300])


@pytest.mark.parametrize("path", WS_ROUTES)
def test_admitted_hosts_open_the_websockets(server: LiveServer, path: str) -> None:
    for host in ADMITTED_HOSTS:
        answer = _ws_exchange(server.settings.port, _ws_handshake(path, [host]), head_only=True)
        assert answer.startswith(b"HTTP/1.1 101"), (host, answer[:200])
        assert b"host_not_allowed" not in answer, host


async def _rebound(live: LiveServer, path: str, name: str) -> tuple[str, int | None]:
    """The real websockets client, as the page's browser: its socket goes to 127.0.0.1,
    its URL (so Host and Origin) says `name`. A Realtime refusal is typed as OpenAI types
    the client's errors (`invalid_request_error`)."""
    port = live.settings.port
    sock = socket.create_connection(("127.0.0.1", port))
    origin = f"http://{name}:{port}"
    async with connect(f"ws://{name}:{port}{path}", sock=sock, origin=origin) as ws:  # type: ignore[arg-type]
        event = json.loads(await asyncio.wait_for(ws.recv(), 5))
        await asyncio.wait_for(ws.wait_closed(), 5)
    if path == "/v1/realtime":  # OpenAI's shape: the client's to fix, not a server error
        assert event["error"]["type"] == "invalid_request_error", event
    code = event.get("code") or event["error"]["code"]
    return str(code), ws.close_code


@pytest.mark.parametrize("path", WS_ROUTES)
async def test_a_rebound_page_cannot_open_the_websockets(server: LiveServer, path: str) -> None:
    assert await _rebound(server, path, EVIL) == ("host_not_allowed", 1008)


async def test_a_rebound_page_cannot_use_the_http_api(server: LiveServer) -> None:
    """Origin and Host both the page's name (what the Origin check alone took for the
    server's own page): refused by the Host check on every route, nothing synthesised."""
    tts = server.runtime.engines.tts[0]
    assert isinstance(tts, FakeTts)
    origin = f"http://{EVIL}:{server.settings.port}"
    host = f"{EVIL}:{server.settings.port}".encode()
    for route in ROUTES:
        word = next(_words)
        answer = _exchange(server.settings.port, _request(route, [host], word, origin=origin))
        assert (_status(answer), _code(answer)) == (403, "host_not_allowed"), route
        assert not [call for call in tts.calls if word in call]


async def test_the_attack_costs_the_others_nothing(server: LiveServer) -> None:
    """Six hundred refused requests and handshakes beside a live stream."""
    loop = asyncio.get_running_loop()
    port = server.settings.port
    attacks = [
        (_exchange, _request("speech", [host], "x"))
        if n % 2
        else (_ws_exchange, _ws_handshake("/v1/realtime", [host]))
        for n, host in enumerate(REFUSED_HOSTS * 20)
    ]
    async with watched(server.http_url) as watch:
        for batch in range(0, len(attacks), 16):
            await asyncio.gather(
                *(
                    loop.run_in_executor(None, exchange, port, request)
                    for exchange, request in attacks[batch : batch + 16]
                )
            )
    watch.assert_unhurt(max_growth_mb=60)


# -- the setting and its users ---------------------------------------------------------------


def test_star_turns_the_check_off() -> None:
    """`allowed_hosts = ["*"]`: any Host (a proxy that checks it itself); then a page's
    Origin equal to its Host passes as the server's own, as documented."""
    live = _server(allowed_hosts=["*"])
    try:
        origin = f"http://{EVIL}:{live.settings.port}"
        host = f"{EVIL}:{live.settings.port}".encode()
        answer = _exchange(live.settings.port, _request("models", [host], "", origin=origin))
        assert _status(answer) == 200
    finally:
        stop_server(live)


def test_the_openai_sdk_is_unaffected(server: LiveServer) -> None:
    for base in (server.http_url, f"http://localhost:{server.settings.port}"):
        with openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0) as client:
            speech = client.audio.speech.create(
                model="tts-1", voice="fake", input="hello there", response_format="wav"
            )
            assert speech.content.startswith(b"RIFF")
            text = client.audio.transcriptions.create(
                model="whisper-1", file=("a.wav", io.BytesIO(_wav()))
            )
            assert isinstance(text.text, str)
            secret = client.realtime.client_secrets.create()
            assert secret.value.startswith("ek_")


HOST_VALUES = [
    ("LOCALHOST:8000", "localhost"),
    ("localhost.", "localhost"),
    ("[::1]:1", "::1"),
    ("[0:0::1]", "::1"),
    ("Voice.Example.COM.", "voice.example.com"),
    ("127.0.0.1:", "127.0.0.1"),
    ("::1", None),
    ("[::1", None),
    ("a b", None),
    ("a:b", None),
    ("a:123456", None),
    ("x" * 301, None),
    ("", None),
    ("é.example", None),
]


@pytest.mark.parametrize(("value", "host"), HOST_VALUES)
def test_host_values_are_read_as_browsers_write_them(value: str, host: str | None) -> None:
    assert host_of(value) == host


def test_the_configured_host_and_the_reached_address_are_the_servers() -> None:
    rule = HostRule.from_settings(Settings(host="voice.lan", allowed_hosts=["*.corp.example"]))
    assert rule.allows("voice.lan") and rule.allows("a.b.corp.example")
    assert not rule.allows("corp.example") and not rule.allows("evil.example")
    every = HostRule.from_settings(Settings(host="0.0.0.0"))
    # An address is looked up by no one: the one the connection reached is the server's.
    assert every.allows("192.168.1.5", local="192.168.1.5")
    assert every.allows("192.168.1.5", local="::ffff:192.168.1.5")
    assert not every.allows("192.168.1.6", local="192.168.1.5")
    assert not every.allows("0.0.0.0") and not every.allows("::")


@pytest.mark.parametrize(
    "entry", ["http://a.example", "a.example:8000", "a.example/x", "*", "*a.example", "", "é.x"]
)
def test_a_bad_allowed_hosts_entry_stops_serve(entry: str) -> None:
    if entry == "*":
        assert Settings(allowed_hosts=[entry]).allowed_hosts == ["*"]
        return
    with pytest.raises(ValueError, match="is not a host name"):
        Settings(allowed_hosts=[entry])


def test_the_flag_and_the_environment_take_comma_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXSERVE_ALLOWED_HOSTS", "A.example., *.b.example")
    assert Settings().allowed_hosts == ["a.example", "*.b.example"]
    done = subprocess.run(
        [sys.executable, "-m", "voxserve", "serve", "--allowed-host", "ok.example,http://x"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--allowed-host: 'http://x' is not a host name" in lines[0]

"""POST /v1/realtime/calls end to end: a real server (fake engines: these tests are about the
call, not speech) and a real aiortc peer on real UDP sockets: the offer posted raw and
through the official SDK (`client.realtime.calls.create`), the answer applied, the
`oai-events` channel opened, session.created on it; hang-ups (DELETE, the SDK's
calls.hangup) free the call; bad offers, keys, a full port range, a peer that never
connects."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aioice import stun
from aioice.ice import get_host_addresses
from aiortc import (
    AudioStreamTrack,
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCSessionDescription,
)
from av import AudioFrame
from openai import AsyncOpenAI
from pydantic import SecretStr
from starlette.testclient import TestClient

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import fake_runtime
from tests.helpers import eventually, wait_ready
from voxserve.config import (
    IceServer,
    LimitsConfig,
    QuotaLimits,
    QuotasConfig,
    WebRtcConfig,
    load_settings,
)
from voxserve.server.app import create_app
from voxserve.server.webrtc.peer import MAX_CANDIDATES, MAX_EARLY, Peer
from voxserve.server.webrtc.ports import PortRange

ROOT = Path(__file__).resolve().parents[2]

KEY = "webrtc-test-key"
PORT_MIN = 41_000 + free_port() % 20_000
PORT_MAX = PORT_MIN + 15
CONNECT_TIMEOUT_S = 1.5
MEDIA_TIMEOUT_S = 1.5
CALLS = "/v1/realtime/calls"


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    webrtc = WebRtcConfig(
        port_min=PORT_MIN,
        port_max=PORT_MAX,
        connect_timeout_s=CONNECT_TIMEOUT_S,
        media_timeout_s=MEDIA_TIMEOUT_S,
    )
    settings = load_settings(
        port=free_port(), log_level="warning", api_keys=[SecretStr(KEY)], webrtc=webrtc
    )
    live = start_server(settings, fake_runtime(settings))
    yield live
    stop_server(live)


class Caller:
    """An aiortc peer as a browser makes one: a microphone track (aiortc's silence) and the
    `oai-events` channel, created before the offer."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.sender = self.pc.addTrack(AudioStreamTrack())
        self.channel: RTCDataChannel = self.pc.createDataChannel("oai-events")
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.opened = asyncio.Event()
        self.closed = asyncio.Event()
        self.channel.on("open", self.opened.set)
        self.channel.on("close", self.closed.set)
        self.channel.on("message", lambda text: self.events.put_nowait(json.loads(text)))

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return str(self.pc.localDescription.sdp)

    async def answer(self, sdp: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))

    async def next_event(self, timeout_s: float = 10.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout_s):
            return await self.events.get()

    async def close(self) -> None:
        await self.pc.close()


class MutedTrack(MediaStreamTrack):
    """A microphone that gives nothing: the caller sends no more RTP (ICE, DTLS and the
    channel stay up), as a peer whose media died."""

    kind = "audio"

    async def recv(self) -> AudioFrame:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@contextlib.asynccontextmanager
async def caller() -> Any:
    peer = Caller()
    try:
        yield peer
    finally:
        await peer.close()


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def candidate_ports(sdp: str) -> list[int]:
    """The ports of the host candidates of an SDP."""
    found = re.findall(r"^a=candidate:\S+ \d+ udp \d+ \S+ (\d+) typ host", sdp, re.M | re.I)
    return [int(port) for port in found]


def active_webrtc(live: LiveServer) -> float:
    text = httpx.get(f"{live.http_url}/metrics").text
    values = re.findall(
        r'^voxserve_sessions_active\{[^}]*transport="webrtc"[^}]*\} (\S+)', text, re.M
    )
    return sum(float(v) for v in values)


async def post_offer(live: LiveServer, sdp: str, key: str = KEY) -> httpx.Response:
    async with httpx.AsyncClient(base_url=live.http_url, timeout=20) as http:
        headers = {**auth(key), "Content-Type": "application/sdp"}
        return await http.post(CALLS, content=sdp, headers=headers)


async def test_call_opens_and_delete_frees_it(server: LiveServer) -> None:
    async with caller() as peer:
        response = await post_offer(server, await peer.offer())
        assert response.status_code == 201, response.text
        assert response.headers["content-type"].startswith("application/sdp")
        location = response.headers["location"]
        assert re.fullmatch(r"/v1/realtime/calls/rtc_\S+", location)
        ports = candidate_ports(response.text)
        assert ports and all(PORT_MIN <= port <= PORT_MAX for port in ports), ports
        await peer.answer(response.text)
        async with asyncio.timeout(10):
            await peer.opened.wait()
        created = await peer.next_event()
        assert created["type"] == "session.created"
        assert location.endswith(created["session"]["id"].removeprefix("sess_"))
        assert active_webrtc(server) == 1
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            other = await http.delete(location, headers=auth("not-the-key"))
            assert other.status_code == 401
            gone = await http.delete(location, headers=auth())
            assert gone.status_code == 204
            # The session's end is told on the channel before the call closes.
            while (ended := await peer.next_event())["type"] != "voxserve.session.ended":
                pass
            assert "packets_lost" in ended and "concealed_ms" in ended
            async with asyncio.timeout(10):
                await peer.closed.wait()
            after = [peer.events.get_nowait()["type"] for _ in range(peer.events.qsize())]
            assert "voxserve.session.ended" not in after  # told once
            again = await http.delete(location, headers=auth())
            assert again.status_code == 404
            assert again.json()["error"]["code"] == "call_not_found"
    await eventually(lambda: active_webrtc(server) == 0 and server.runtime.active_sessions == 0)


async def test_sdk_create_with_session_and_hangup(server: LiveServer) -> None:
    async with (
        AsyncOpenAI(api_key=KEY, base_url=f"{server.http_url}/v1") as client,
        caller() as peer,
    ):
        session = {"type": "realtime", "model": "gpt-realtime", "instructions": "Be brief."}
        answer = await client.realtime.calls.create(sdp=await peer.offer(), session=session)
        sdp = answer.text
        call_id = answer.response.headers["location"].rsplit("/", 1)[1]
        # OpenAI's browser sample sends session.update the moment the channel opens.
        early = {"type": "session.update", "session": {"type": "realtime", "instructions": "Hi"}}
        peer.channel.on("open", lambda: peer.channel.send(json.dumps(early)))
        await peer.answer(sdp)
        created = await peer.next_event()
        assert created["type"] == "session.created"
        assert created["session"]["instructions"] == "Be brief."
        assert created["session"]["model"] == "gpt-realtime"
        updated = await peer.next_event()
        assert updated["type"] == "session.updated", updated
        assert updated["session"]["instructions"] == "Hi"
        await client.realtime.calls.hangup(call_id)
        async with asyncio.timeout(10):
            await peer.closed.wait()
    await eventually(lambda: active_webrtc(server) == 0)


async def test_bad_offers_and_keys(server: LiveServer) -> None:
    async with caller() as peer:
        offer = await peer.offer()
    wrong = await post_offer(server, offer, key="wrong")
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "unauthorized"
    no_ice = re.sub(r"a=ice-(ufrag|pwd):.*\r\n", "", offer)  # parses; aiortc refuses it
    bad_rtp = re.sub(r"a=rtpmap:(\d+) opus", r"a=rtpmap:\1 opus/x", offer)
    broken = ("", "hello", "v=0\r\nm=audio x\r\n", offer.replace("m=application", "m=text"))
    for bad in (*broken, no_ice, bad_rtp, offer.replace("a=setup:", "a=setup:sideways")):
        response = await post_offer(server, bad)
        assert response.status_code == 400, (bad[:40], response.text)
        assert response.json()["error"]["code"] == "invalid_sdp"
    audio = re.search(r"m=audio.*?(?=m=application)", offer, flags=re.S)
    assert audio is not None
    many = offer + audio.group(0) * 4  # m-lines past the bound (each would take ports)
    response = await post_offer(server, many)
    assert response.status_code == 400
    assert "m-lines" in response.json()["error"]["message"]
    candidate = "a=candidate:1 1 udp 2130706431 192.0.2.9 {port} typ host\r\n"
    spray = "".join(candidate.format(port=9000 + i) for i in range(MAX_CANDIDATES + 1))
    response = await post_offer(server, offer.replace("a=end-of-candidates", spray, 1))
    assert response.status_code == 400  # the server would send STUN checks to each
    assert "ICE candidates" in response.json()["error"]["message"]
    no_audio = offer.replace(audio.group(0), "")
    response = await post_offer(server, no_audio)
    assert response.status_code == 400
    assert "audio" in response.json()["error"]["message"]
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        text = await http.post(
            CALLS, content=offer, headers={**auth(), "Content-Type": "text/plain"}
        )
        assert text.status_code == 415
        session = {"type": "realtime", "audio": {"output": {"voice": "nobody"}}}
        files = {"sdp": (None, offer, "application/sdp"), "session": (None, json.dumps(session))}
        voice = await http.post(CALLS, files=files, headers=auth())
        assert voice.status_code == 400
        assert voice.json()["error"]["code"] == "unknown_voice"
        files = {"sdp": (None, offer), "session": ("session.json", b"\xff{}", "text/plain")}
        binary = await http.post(CALLS, files=files, headers=auth())
        assert binary.status_code == 400
        assert binary.json()["error"]["code"] == "invalid_parameter"  # the session, not the SDP
        unknown = await http.post(f"{CALLS}/rtc_nothing/hangup", headers=auth())
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "call_not_found"
    assert server.runtime.active_sessions == 0


async def test_full_port_range_refuses_the_call(server: LiveServer) -> None:
    held: list[socket.socket] = []
    ports = PortRange(PORT_MIN, PORT_MAX)  # every free port of the server's range, held here
    try:
        for address in get_host_addresses(use_ipv4=True, use_ipv6=True):
            while (sock := ports.bind(address)) is not None:
                held.append(sock)
        async with caller() as peer:
            response = await post_offer(server, await peer.offer())
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "overloaded"
        assert f"{PORT_MIN}-{PORT_MAX}" in error["message"]
        assert "Retry-After" in response.headers
    finally:
        for sock in held:
            sock.close()
    assert server.runtime.active_sessions == 0


async def test_peer_that_never_connects_is_freed(server: LiveServer) -> None:
    async with caller() as peer:
        response = await post_offer(server, await peer.offer())
        assert response.status_code == 201
        location = response.headers["location"]
        assert active_webrtc(server) == 1
        # The answer is never applied: no ICE, no channel.
        await eventually(lambda: active_webrtc(server) == 0, timeout_s=CONNECT_TIMEOUT_S + 5)
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        gone = await http.delete(location, headers=auth())
        assert gone.status_code == 404
    assert server.runtime.active_sessions == 0


async def test_peer_that_stops_sending_media_is_freed(server: LiveServer) -> None:
    async with caller() as peer:
        response = await post_offer(server, await peer.offer())
        assert response.status_code == 201
        await peer.answer(response.text)
        assert (await peer.next_event())["type"] == "session.created"
        peer.sender.replaceTrack(MutedTrack())
        async with asyncio.timeout(MEDIA_TIMEOUT_S + 5):
            await peer.closed.wait()
        await eventually(lambda: active_webrtc(server) == 0)
        gone = await post_offer_delete(server, response.headers["location"])
        assert gone.status_code == 404


async def post_offer_delete(live: LiveServer, location: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=live.http_url) as http:
        return await http.delete(location, headers=auth())


async def test_origin_of_another_site_is_refused(server: LiveServer) -> None:
    async with caller() as peer:
        offer = await peer.offer()
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        headers = {**auth(), "Content-Type": "application/sdp", "Origin": "https://evil.example"}
        response = await http.post(CALLS, content=offer, headers=headers)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "origin_not_allowed"


def test_disabled_webrtc_has_no_route() -> None:
    settings = load_settings(log_level="warning", webrtc=WebRtcConfig(enabled=False))
    # TestClient's own Host, testserver, is no name of this server's (server/host_guard.py).
    client = TestClient(create_app(fake_runtime(settings)), base_url="http://localhost")
    response = client.post(CALLS, content="v=0", headers={"Content-Type": "application/sdp"})
    assert response.status_code == 404


def test_without_aiortc_the_route_answers_501() -> None:
    """The server runs without the webrtc extra (aiortc made unimportable in a fresh
    interpreter) and says why a call cannot be made."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["aiortc"] = None
        from starlette.testclient import TestClient
        from tests.fakes import fake_runtime
        from voxserve.config import load_settings
        from voxserve.server.app import create_app
        settings = load_settings(log_level="warning")
        client = TestClient(create_app(fake_runtime(settings)), base_url="http://localhost")
        r = client.post("/v1/realtime/calls", content="v=0",
                        headers={"Content-Type": "application/sdp"})
        print(r.status_code, r.json()["error"]["code"])
        assert "aiortc" not in [m for m, v in sys.modules.items() if v is not None]
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split() == ["501", "webrtc_unavailable"]


def serve(port: int, log: Path) -> subprocess.Popen[bytes]:
    """`voxserve serve` on the load engines (a drain deadline of 2 s)."""
    env = {
        **os.environ,
        "VOXSERVE_LIMITS__DRAIN_TIMEOUT_S": "2",
        "VOXSERVE_CACHE__ENABLED": "false",
        "PYTHONPATH": str(ROOT),
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "voxserve", "serve", "--config", "bench/load-engines.toml",
             "--port", str(port), "--grpc-port", "0", "--wyoming-port", "0"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


async def test_sigterm_ends_calls_with_server_shutdown(tmp_path: Path) -> None:
    """A live call on `voxserve serve` (the load engines): SIGTERM ends its session with
    session.ended server_shutdown on the channel, the call closes, the process exits 0."""
    port = free_port()
    log = tmp_path / "server.log"
    proc = serve(port, log)
    try:
        await asyncio.to_thread(wait_ready, proc, port, log)
        async with caller() as peer, httpx.AsyncClient() as http:
            url = f"http://127.0.0.1:{port}{CALLS}"
            headers = {"Content-Type": "application/sdp"}
            response = await http.post(url, content=await peer.offer(), headers=headers)
            assert response.status_code == 201, response.text
            await peer.answer(response.text)
            assert (await peer.next_event())["type"] == "session.created"
            proc.send_signal(signal.SIGTERM)
            while (event := await peer.next_event())["type"] != "voxserve.session.ended":
                pass
            assert event["reason"] == "server_shutdown"
            async with asyncio.timeout(10):
                await peer.closed.wait()
        assert await asyncio.to_thread(proc.wait, 20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_client_secret_call(server: LiveServer) -> None:
    """A browser's way: the page gets a client secret (minted with the key), calls with it;
    the secret's session applies, then the form's; the secret is spent, and yet hangs up
    the call it made."""
    async with httpx.AsyncClient(base_url=server.http_url, timeout=20) as http:
        body = {"session": {"type": "realtime", "instructions": "From the secret."}}
        minted = await http.post("/v1/realtime/client_secrets", json=body, headers=auth())
        assert minted.status_code == 200, minted.text
        secret = minted.json()["value"]
        async with caller() as peer:
            offer = await peer.offer()
            session = json.dumps({"type": "realtime", "audio": {"output": {"speed": 1.25}}})
            files = {"sdp": (None, offer, "application/sdp"), "session": (None, session)}
            response = await http.post(CALLS, files=files, headers=auth(secret))
            assert response.status_code == 201, response.text
            await peer.answer(response.text)
            created = await peer.next_event()
            assert created["session"]["instructions"] == "From the secret."
            assert created["session"]["audio"]["output"]["speed"] == 1.25
            again = await post_offer(server, offer, key=secret)
            assert again.status_code == 401
            location = response.headers["location"]
            # The page hangs up with the secret it called with (spent, yet its call's).
            assert (await http.delete(location, headers=auth("ek_other"))).status_code == 404
            assert (await http.delete(location, headers=auth(secret))).status_code == 204
    await eventually(lambda: active_webrtc(server) == 0)


async def test_caller_closing_its_peer_connection_frees_the_call(server: LiveServer) -> None:
    """What a page does to end a call: close its RTCPeerConnection. The server sees the
    channel and the connection close: freed at once, not after a timeout."""
    async with caller() as peer:
        response = await post_offer(server, await peer.offer())
        await peer.answer(response.text)
        assert (await peer.next_event())["type"] == "session.created"
        await peer.close()
        await eventually(lambda: active_webrtc(server) == 0, timeout_s=MEDIA_TIMEOUT_S - 0.5)


class StunResponder(asyncio.DatagramProtocol):
    """A minimal STUN server (RFC 5389 binding): answers with the address it saw."""

    transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        request = stun.parse_message(data)
        response = stun.Message(
            message_method=stun.Method.BINDING,
            message_class=stun.Class.RESPONSE,
            transaction_id=request.transaction_id,
        )
        response.attributes["XOR-MAPPED-ADDRESS"] = (addr[0], addr[1] + 1)
        self.transport.sendto(bytes(response), addr)


async def test_stun_reflexive_candidates_on_the_port_range() -> None:
    """With a STUN server configured, the server-reflexive candidates are asked for on the
    range's sockets (their related port is in the range), as aioice does on its own."""
    loop = asyncio.get_running_loop()
    v4 = [a for a in get_host_addresses(use_ipv4=True, use_ipv6=False)]
    transport, _ = await loop.create_datagram_endpoint(StunResponder, local_addr=(v4[0], 0))
    stun_port = transport.get_extra_info("sockname")[1]
    low = PORT_MAX + 1
    webrtc = WebRtcConfig(
        port_min=low,
        port_max=low + 7,
        ice_servers=[IceServer(urls=[f"stun:{v4[0]}:{stun_port}"])],
    )
    settings = load_settings(port=free_port(), log_level="warning", webrtc=webrtc)
    live = await asyncio.to_thread(start_server, settings, fake_runtime(settings))
    try:
        async with caller() as peer:
            response = await post_offer(live, await peer.offer())
        assert response.status_code == 201, response.text
        reflexive = re.findall(
            r"^a=candidate:\S+ \d+ udp \d+ \S+ (\d+) typ srflx raddr \S+ rport (\d+)",
            response.text,
            re.M | re.I,
        )
        assert reflexive, response.text
        for port, related in reflexive:
            assert low <= int(related) <= low + 7
            assert int(port) == int(related) + 1  # what our STUN server answered
    finally:
        transport.close()
        await asyncio.to_thread(stop_server, live)


async def test_admission_and_quota_refusals_are_http_errors() -> None:
    """The global rule (limits.max_sessions) and the key's quota (its sessions) refuse at
    POST time, with Retry-After, before any answer or port."""
    quotas = QuotasConfig(default=QuotaLimits(max_sessions=1))
    settings = load_settings(
        port=free_port(),
        log_level="warning",
        api_keys=[SecretStr(KEY), SecretStr("second-key")],
        quotas=quotas,
        limits=LimitsConfig(max_sessions=2),
    )
    live = await asyncio.to_thread(start_server, settings, fake_runtime(settings))
    try:
        async with caller() as first, caller() as second, caller() as third:
            assert (await post_offer(live, await first.offer())).status_code == 201
            over_quota = await post_offer(live, await second.offer())
            assert over_quota.status_code == 429, over_quota.text
            assert over_quota.json()["error"]["code"] == "quota_exceeded"
            assert "Retry-After" in over_quota.headers
            other = await post_offer(live, await second.offer(), key="second-key")
            assert other.status_code == 201
            full = await post_offer(live, await third.offer(), key="second-key")
            assert full.status_code == 503, full.text
            assert full.json()["error"]["code"] == "overloaded"
            assert "Retry-After" in full.headers
    finally:
        await asyncio.to_thread(stop_server, live)


async def test_messages_before_the_link_are_held() -> None:
    """A client event sent as the channel opens (before the call's link exists: a browser
    sends right after its DCEP OPEN) is held by the peer and handed over once; the peer
    holds nothing after."""
    server = Peer(WebRtcConfig(), PortRange(0, 0))
    async with caller() as peer:
        try:
            early = json.dumps({"type": "session.update", "session": {"instructions": "Hi"}})
            peer.channel.on("open", lambda: peer.channel.send(early))
            await peer.answer(await server.answer(await peer.offer()))
            assert await server.connected(10)
            await eventually(lambda: len(server.early) == 1)
            assert server.take_early() == [early]
            peer.channel.send("later")
            await asyncio.sleep(0.2)
            assert server.take_early() == []  # the link's from now on
            assert server.early_dropped == 0
        finally:
            await server.close()


async def test_a_flood_before_the_link_is_bounded_and_counted() -> None:
    """Past MAX_EARLY held messages the peer keeps only a count (handed to the link, which
    tells the caller): a flood as the channel opens costs no memory and is never silent."""
    server = Peer(WebRtcConfig(), PortRange(0, 0))
    async with caller() as peer:
        try:
            flood = MAX_EARLY + 6

            def send_all() -> None:
                for i in range(flood):
                    peer.channel.send(json.dumps({"type": "input_audio_buffer.clear", "n": i}))

            peer.channel.on("open", send_all)
            await peer.answer(await server.answer(await peer.offer()))
            assert await server.connected(10)
            await eventually(lambda: len(server.early) + server.early_dropped == flood)
            assert len(server.take_early()) == MAX_EARLY
            assert server.early_dropped == 6
        finally:
            await server.close()


async def test_a_session_slow_to_read_is_not_a_silent_caller() -> None:
    """The media watch counts from the caller's last packet off the network, not from the
    last one the session read: a session that reads nothing for longer than
    media_timeout_s (its input waiting) keeps a caller who is talking; the caller's
    silence ends the watch."""
    server = Peer(WebRtcConfig(media_timeout_s=1.0), PortRange(0, 0))
    async with caller() as peer:
        try:
            await peer.answer(await server.answer(await peer.offer()))
            assert await server.connected(10)
            assert server.inbound is not None  # and nobody reads it
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(server.watch_media(), 2.5)
            await peer.close()  # the caller stops sending
            await asyncio.wait_for(server.watch_media(), 5)
        finally:
            await server.close()

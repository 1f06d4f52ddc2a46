"""TLS shared by HTTPS and gRPC: one self-signed certificate made for the test, one server."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import fake_runtime
from tests.transports.grpc_client import stub
from voxserve.config import load_settings
from voxserve.v1 import voxserve_pb2 as pb


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, by the openssl command line."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a test certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    command = [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    command += ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"]
    command += ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"]
    subprocess.run(
        command,
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    cert, key = self_signed(tmp_path_factory.mktemp("tls"))
    settings = load_settings(port=free_port(), log_level="warning")
    settings = settings.model_copy(update={"tls_cert_file": cert, "tls_key_file": key})
    live = start_server(settings, fake_runtime(settings), grpc_port=free_port())
    yield live
    stop_server(live)


async def test_grpc_over_tls(tls_server: LiveServer) -> None:
    cert = tls_server.settings.tls_cert_file
    assert cert is not None
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    async with grpc.aio.secure_channel(tls_server.grpc_target, credentials) as channel:
        voices = await stub(channel).ListVoices(pb.ListVoicesRequest())
    assert voices.default_voice == "fake"
    # A plaintext client cannot talk to the TLS port.
    async with grpc.aio.insecure_channel(tls_server.grpc_target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub(channel).ListVoices(pb.ListVoicesRequest(), timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_https_with_the_same_certificate(tls_server: LiveServer) -> None:
    cert = tls_server.settings.tls_cert_file
    assert tls_server.http_url.startswith("https://")
    trust = ssl.create_default_context(cafile=str(cert))
    reply = httpx.get(f"{tls_server.http_url}/v1/voices", verify=trust, timeout=5)
    assert reply.status_code == 200 and reply.json()["default"] == "fake"

"""Servers for the transport tests: fake engines (plumbing) with gRPC and Wyoming on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import FakeAsr, fake_runtime
from tests.helpers import settings_with
from voxserve.config import load_settings


def start_fake_server(engines: dict[str, Any] | None = None, **limits: int) -> LiveServer:
    """Fake engines (`engines` replaces some, as fake_runtime takes them), optional limits."""
    settings = settings_with(load_settings(port=free_port(), log_level="warning"), limits=limits)
    runtime = fake_runtime(settings, **{"asr": FakeAsr(delay_s=0.02), **(engines or {})})
    return start_server(settings, runtime, grpc_port=free_port(), wyoming_port=free_port())


@pytest.fixture(scope="module")
def fake_server() -> Iterator[LiveServer]:
    """Fake engines (tones in, tone words out) behind real gRPC and Wyoming servers."""
    live = start_fake_server()
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def one_session_server() -> Iterator[LiveServer]:
    """Fake engines and `limits.max_sessions = 1`, for overload refusal."""
    live = start_fake_server(max_sessions=1)
    yield live
    stop_server(live)

"""What the bench tests share: a server with the load engines (bench/load-engines.toml)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer, free_port, start_server, stop_server
from voxserve.config import load_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def load_server() -> Iterator[LiveServer]:
    """A live server in this process with the load engines (costs ~0), one per module."""
    settings = load_settings(
        ROOT / "bench" / "load-engines.toml", port=free_port(), log_level="warning"
    )
    live = start_server(settings)
    yield live
    stop_server(live)

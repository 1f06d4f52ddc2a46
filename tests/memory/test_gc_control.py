"""GC control on a real server: thresholds from the settings, a freeze after the models
load, the pause histogram, and /debug/memory reporting it all (admin key)."""

from __future__ import annotations

import gc

import httpx
from pydantic import SecretStr

from tests.conftest import free_port, start_server, stop_server
from voxserve.config import GcConfig, load_settings


def test_thresholds_freeze_and_pauses_are_reported() -> None:
    settings = load_settings(
        "bench/load-engines.toml",
        port=free_port(),
        log_level="warning",
        admin_key=SecretStr("k"),
        gc=GcConfig(thresholds=(12_345, 11, 12)),
    )
    previous = gc.get_threshold()
    live = start_server(settings)
    try:
        assert gc.get_threshold() == (12_345, 11, 12)
        assert gc.get_freeze_count() > 10_000  # modules, engines: out of every collection
        gc.collect()
        headers = {"Authorization": "Bearer k"}
        body = httpx.get(f"{live.http_url}/debug/memory", headers=headers).json()
        assert body["gc"]["thresholds"] == [12_345, 11, 12] and body["gc"]["frozen"] > 10_000
        assert body["rss_bytes"] > 0 and body["pss_bytes"] > 0 and body["uss_bytes"] > 0
        assert body["threads"] > 0 and body["fds"] > 0 and body["tasks"] > 0
        stats = httpx.get(f"{live.http_url}/debug/stats", headers=headers).json()
        assert stats["process"]["fds"] > 0 and stats["process"]["tasks"] > 0
        metrics = httpx.get(f"{live.http_url}/metrics").text
        assert 'voxserve_gc_pause_seconds_count{generation="2"}' in metrics
    finally:
        stop_server(live)
        gc.set_threshold(*previous)

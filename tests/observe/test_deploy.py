"""deploy/: the alert rules and the dashboard only name metrics a live server exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import fake_runtime
from voxserve.config import load_settings

DEPLOY = Path(__file__).parents[2] / "deploy"
METRIC = re.compile(r"\bvoxserve_[a-z0-9_]+")


@pytest.fixture(scope="module")
def exported() -> Iterator[set[str]]:
    """Every metric and sample name /metrics of a fresh test server shows."""
    settings = load_settings(port=free_port(), log_level="warning")
    live: LiveServer = start_server(settings, fake_runtime(settings))
    try:
        text = httpx.get(f"{live.http_url}/metrics", timeout=10).text
    finally:
        stop_server(live)
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        if family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_count", "_sum"))
        names.update(sample.name for sample in family.samples)
    yield names


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load((DEPLOY / "prometheus-alerts.yml").read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def test_alert_rules_are_well_formed() -> None:
    found = rules()
    names = {rule["alert"] for rule in found}
    assert {
        "VoxservePoolNearlyFull",
        "VoxserveMemoryHigh",
        "VoxserveTurnLatencyHigh",
        "VoxserveErrorRateHigh",
        "VoxserveSessionsRefused",
    } <= names
    for rule in found:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert isinstance(rule["expr"], str) and METRIC.search(rule["expr"]), rule
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
    pool = next(r for r in found if r["alert"] == "VoxservePoolNearlyFull")
    assert pool["for"] == "1m" and "0.9" in pool["expr"]


def test_alerts_name_only_exported_metrics(exported: set[str]) -> None:
    for rule in rules():
        missing = set(METRIC.findall(rule["expr"])) - exported
        assert not missing, (rule["alert"], missing)


def test_dashboard_names_only_exported_metrics(exported: set[str]) -> None:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 10
    used = {name for expr in exprs for name in METRIC.findall(expr)}
    assert not used - exported, used - exported
    for expr in exprs:
        assert expr.count("(") == expr.count(")"), expr
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_shows_one_shot_tts() -> None:
    """Operators of an OpenAI-style TTS service see its latency: one-shot (bulk) first
    audio by source, and the TTS stage's bulk calls and queue wait."""
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    (panel,) = [p for p in dashboard["panels"] if p["title"].startswith("One-shot TTS")]
    exprs = " ".join(t["expr"] for t in panel["targets"])
    assert (
        'voxserve_tts_first_audio_seconds_bucket{instance=~"$instance",work_class="bulk"}' in exprs
    )
    for name in (
        "voxserve_stage_latency_seconds_bucket",
        "voxserve_stage_queue_wait_seconds_bucket",
    ):
        assert f'{name}{{instance=~"$instance",stage="tts",work_class="bulk"}}' in exprs, name

"""How a process joins a cluster (voxserve/cluster/connect.py), without starting Ray: the token
auth for a cluster on this host, on which every process agrees before it imports Ray, even
when several start at once on a fresh machine (CI's "InvalidAuthToken ... RAY_AUTH_MODE is
currently 'disabled'"); and the node a driver joins where one host runs several."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from voxserve.cluster.connect import init_kwargs, local_token_auth
from voxserve.config import load_settings


@pytest.fixture
def fresh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    return tmp_path / ".ray" / "auth_token"


def test_a_fresh_machine_gets_a_token_and_token_mode(fresh_home: Path) -> None:
    local_token_auth()
    token = fresh_home.read_text()
    assert len(token) == 64 and int(token, 16) >= 0  # 256 bits in hex, as Ray makes them
    assert fresh_home.stat().st_mode & 0o777 == 0o600
    assert os.environ["RAY_AUTH_MODE"] == "token"
    assert [p.name for p in fresh_home.parent.iterdir()] == ["auth_token"]  # no draft left


def test_an_existing_token_is_kept(fresh_home: Path) -> None:
    fresh_home.parent.mkdir()
    fresh_home.write_text("a" * 64)
    local_token_auth()
    assert fresh_home.read_text() == "a" * 64
    assert os.environ["RAY_AUTH_MODE"] == "token"


def test_a_mode_set_by_the_user_is_kept(fresh_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    local_token_auth()
    assert os.environ["RAY_AUTH_MODE"] == "disabled"
    assert not fresh_home.exists()


def test_processes_starting_at_once_agree_on_one_token(fresh_home: Path) -> None:
    """Eight interpreters race to make the file: each reads back the token it will send,
    and all of them read the same one (a loser never overwrites, nor reads a half file)."""
    code = (
        "import os; from pathlib import Path; from voxserve.cluster.connect import "
        "local_token_auth; local_token_auth(); "
        "print(os.environ['RAY_AUTH_MODE'], (Path.home() / '.ray' / 'auth_token').read_text())"
    )
    env = {**os.environ, "HOME": str(fresh_home.parent.parent)}
    racers = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    answers = {r.communicate(timeout=60)[0].strip() for r in racers}
    assert answers == {f"token {fresh_home.read_text()}"}, answers


def test_a_driver_joins_the_node_its_settings_name() -> None:
    """scripts/ray_nodes.sh runs three nodes on one host; left to itself Ray's driver joins
    the head's, whose address the other nodes' replicas cannot answer."""
    assert init_kwargs("10.77.0.11:6379", "10.77.0.1")["_node_ip_address"] == "10.77.0.1"
    assert "_node_ip_address" not in init_kwargs("10.77.0.11:6379")  # Ray's own choice
    assert init_kwargs("127.0.0.1:6379")["_node_ip_address"] == "127.0.0.1"
    assert init_kwargs(None)["address"] == "local"


def test_the_node_address_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXSERVE_CLUSTER__NODE_IP_ADDRESS", "10.77.0.1")
    assert load_settings().cluster.node_ip_address == "10.77.0.1"

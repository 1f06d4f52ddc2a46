"""Models by name against the stand-in of the Hugging Face Hub (tests/hub_standin.py): every
test gets its own empty HF_HOME and HF_ENDPOINT pointing at the stand-in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hub_standin import HubStandin, hub

__all__ = ["hf_env", "hub", "small_repo"]

SMALL_REPO = "test-org/small-model"
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "VOXSERVE_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")


@pytest.fixture
def hf_env(tmp_path: Path, hub: HubStandin, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """HF_HOME in tmp (returned), HF_ENDPOINT at the stand-in, no offline flag; for this
    process and the subprocesses a test starts with os.environ."""
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in _OFFLINE_VARS:
        monkeypatch.delenv(name, raising=False)
    yield home


@pytest.fixture
def small_repo(hub: HubStandin) -> dict[str, bytes]:
    """A small repo of the shape of a CTranslate2 model: one LFS file (model.bin, 3 MB) and
    plain ones, published as SMALL_REPO."""
    files = {
        "model.bin": os.urandom(3 * 1024 * 1024 + 17),
        "config.json": b'{"alignment_heads": [], "lang_ids": []}\n',
        "tokenizer.json": b'{"version": "1.0"}\n' * 50,
        "README.md": b"---\nlicense: apache-2.0\n---\n",
    }
    hub.add_repo(SMALL_REPO, dict(files), card_data={"license": "apache-2.0"})
    return files
